//! "Once across the fleet" end to end (docs/fleet.md, `cron add --on any`):
//! three real `bramble run` processes, each with its own state directory,
//! against a real mosquitto and a real `nats-server -js` (Debian's package)
//! on 127.0.0.1; the primary with the fake Telegram. Which board ran a slot
//! is read from what each board says it did ("won the slot … scheduled=…").
//! The one fake, for malformed and oversize answers, speaks the NATS client
//! protocol as docs.nats.io "Client Protocol" gives it.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::{bramble, TestHome};
use crate::support::telegram::FakeTelegram;

const TOKEN: &str = "123456:TEST-fleet-any-token";
const ALICE: i64 = 4242;
const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";
const BOARDS: [&str; 3] = ["living", "garage", "shed"];
const WON: &str = "this board won the slot";

/// A real `nats-server -js` on a free port, its store in a temp dir; killed when dropped.
struct Nats {
    child: Option<std::process::Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// `authorization { … }` for the server's config file (empty: anonymous).
    auth: String,
}

impl Nats {
    async fn start() -> Nats {
        Nats::start_with("").await
    }

    /// With an account per board (`pw-<board>`): the shed's may not publish to the bucket.
    async fn start_with_accounts() -> Nats {
        Nats::start_with(
            "authorization {\n  users = [\n    {user: living, password: pw-living}\n    {user: garage, password: pw-garage}\n    \
             {user: shed, password: pw-shed, permissions: {publish: {deny: [\"$KV.>\"]}}}\n  ]\n}\n",
        )
        .await
    }

    async fn start_with(auth: &str) -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut n = Nats { child: None, port, dir: tempfile::tempdir().unwrap(), auth: auth.into() };
        n.launch().await;
        n
    }

    async fn launch(&mut self) {
        let bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("the fleet's --on any tests need a real NATS server: apt-get install nats-server");
        let conf = self.dir.path().join("nats.conf");
        let store = self.dir.path().join("js");
        std::fs::write(&conf, format!("jetstream {{\n  store_dir: \"{}\"\n}}\n{}", store.display(), self.auth))
            .unwrap();
        let child = std::process::Command::new(bin)
            .args(["-c", conf.to_str().unwrap(), "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let port = self.port;
        let up = wait_until(10, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()).await;
        assert!(up, "nats-server did not listen on {port} within 10 s");
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Fleet {
    broker: Mosquitto,
    tg: FakeTelegram,
    llms: Vec<FakeLlm>,
    homes: Vec<TestHome>,
    logs: tempfile::TempDir,
}

fn key_file(home: &TestHome, board: &str) {
    let dir = home.path().join(".config/bramble");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("env");
    std::fs::write(&f, format!("FLEET_KEY={KEY}\nNATS_PASSWORD=pw-{board}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Three boards (living the primary with Telegram; garage and shed nodes), each with `nats_url`.
async fn fleet(nats_url: &str) -> Fleet {
    fleet_with(nats_url, false).await
}

/// `accounts`: each board logs in to NATS as itself.
async fn fleet_with(nats_url: &str, accounts: bool) -> Fleet {
    let broker = Mosquitto::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let mut llms = Vec::new();
    let mut homes = Vec::new();
    for (i, board) in BOARDS.iter().enumerate() {
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let role =
            if i == 0 { "role = \"primary\"\n".to_string() } else { "role = \"node\"\nprimary = \"living\"\n".into() };
        let telegram = if i == 0 {
            format!(
                "[alerts]\ndeliver = [\"telegram:{ALICE}\"]\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"{ALICE}\"]\n\
                 api_base = \"{}\"\n",
                tg.url()
            )
        } else {
            String::new()
        };
        let login = if accounts {
            format!("nats_user = \"{board}\"\nnats_password_env = \"NATS_PASSWORD\"\n")
        } else {
            String::new()
        };
        let home = TestHome::new(
            "openai",
            &llm.base_url(),
            "",
            "max_retries = 0\n",
            &format!(
                "[heartbeat]\nenabled = false\n{telegram}[mqtt]\nurl = \"{}\"\ndevice = \"{board}\"\ndiscovery = false\n\
                 [fleet]\nname = \"{board}\"\n{role}key_env = \"FLEET_KEY\"\ntimeout = \"30s\"\nnats_url = \"{nats_url}\"\n{login}",
                broker.url()
            ),
        );
        key_file(&home, board);
        llms.push(llm);
        homes.push(home);
    }
    Fleet { broker, tg, llms, homes, logs: tempfile::tempdir().unwrap() }
}

impl Fleet {
    /// Start board `i`; its log is `<board>-<n>.log` (a restart writes the next one).
    fn start_board(&self, i: usize) -> Daemon {
        let n = (0..).find(|n| !self.log_path(i, *n).exists()).unwrap();
        Daemon::start_logging_to(self.homes[i].path(), Some(&self.homes[i].config), &self.log_path(i, n))
    }

    fn log_path(&self, i: usize, n: usize) -> PathBuf {
        self.logs.path().join(format!("{}-{n}.log", BOARDS[i]))
    }

    async fn start(&self) -> Vec<Daemon> {
        let boards: Vec<Daemon> = (0..BOARDS.len()).map(|i| self.start_board(i)).collect();
        for d in &boards {
            assert!(d.wait_log("MQTT connected", 30).await, "connected: {}", d.log());
        }
        for b in &BOARDS[1..] {
            self.board_online(b).await;
        }
        boards
    }

    async fn cli(&self, i: usize, args: &[&str]) -> std::process::Output {
        let mut all = vec!["--config", self.homes[i].config.to_str().unwrap()];
        all.extend_from_slice(args);
        bramble(self.homes[i].path(), &all, None).await
    }

    async fn board_online(&self, board: &str) {
        let mut ok = false;
        for _ in 0..60 {
            let out = self.cli(0, &["fleet", "status"]).await;
            if String::from_utf8_lossy(&out.stdout).contains(&format!("{board}: online")) {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(ok, "{board} is online on the broker");
    }

    /// Every log every board wrote, each run's file whole.
    fn all_logs(&self) -> String {
        let mut files: Vec<_> = std::fs::read_dir(self.logs.path()).unwrap().flatten().map(|e| e.path()).collect();
        files.sort();
        files.iter().map(|f| std::fs::read_to_string(f).unwrap_or_default()).collect::<Vec<_>>().join("\n")
    }

    /// How many times each slot was won, across every board and restart.
    fn wins(&self) -> BTreeMap<String, usize> {
        let mut wins = BTreeMap::new();
        for line in self.all_logs().lines().filter(|l| l.contains(WON)) {
            let slot = line.split_whitespace().find_map(|w| w.strip_prefix("scheduled=")).unwrap_or("?");
            *wins.entry(slot.to_string()).or_insert(0) += 1;
        }
        wins
    }

    fn assert_once(&self) -> usize {
        let wins = self.wins();
        assert!(wins.values().all(|n| *n == 1), "a slot won twice: {wins:?}\n{}", self.all_logs());
        wins.len()
    }

    fn sent_with(&self, needle: &str) -> usize {
        self.tg.sent_texts().iter().filter(|t| t.contains(needle)).count()
    }

    /// `cron add … --on any` on the primary, checked to reach all three boards.
    async fn add_any(&self, args: &[&str]) {
        let mut all = vec!["cron", "add"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--on", "any"]);
        let out = self.cli(0, &all).await;
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("for any board: on living, garage, shed"), "{}", text(&out));
    }
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test]
async fn a_job_for_any_board_runs_once_per_slot_across_three_boards_and_a_restart_of_the_winner() {
    let nats = Nats::start().await;
    let f = fleet(&nats.url()).await;
    let mut boards = f.start().await;
    f.add_any(&["tick", "--every", "2s", "--remind", "any-tick", "--deliver", "telegram:4242"]).await;
    // Stored on every board.
    for i in 0..3 {
        let list = text(&f.cli(i, &["cron", "list"]).await);
        assert!(list.contains("tick"), "{list}");
    }
    assert!(wait_until(60, || f.wins().len() >= 4).await, "{}", f.all_logs());
    f.assert_once();
    // The winner of the latest slot stops and starts again; the slots go on, each once.
    let winner = (0..3).find(|i| boards[*i].log().matches(WON).count() > 0).unwrap();
    let stopped = boards.remove(winner);
    stopped.stop().await;
    let before = f.wins().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    boards.insert(winner, f.start_board(winner));
    assert!(wait_until(60, || f.wins().len() >= before + 4).await, "{}", f.all_logs());
    f.assert_once();
    // Stopped everywhere; every slot run is reported once in the chat, from the board that ran it.
    for i in 0..3 {
        let out = f.cli(i, &["cron", "disable", "tick"]).await;
        assert!(out.status.success(), "{}", text(&out));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let slots = f.assert_once();
    assert!(wait_until(60, || f.sent_with("any-tick") == slots).await, "{:?} vs {slots}", f.tg.sent_texts());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.sent_with("any-tick"), slots, "{:?}", f.tg.sent_texts());
    drop(boards);
}

#[tokio::test]
async fn a_board_killed_mid_run_does_not_make_its_slot_run_twice() {
    let nats = Nats::start().await;
    let f = fleet(&nats.url()).await;
    // Every turn hangs: the winner is mid-run when it is killed.
    for llm in &f.llms {
        llm.route(|_| Some(Reply::Delayed(Duration::from_secs(20), Box::new(Reply::text("done late")))));
    }
    let mut boards = f.start().await;
    f.add_any(&["slow", "--every", "5s", "--message", "do the slow thing"]).await;
    let asked = || f.llms.iter().position(|l| l.request_count() > 0);
    assert!(wait_until(60, || asked().is_some()).await, "{}", f.all_logs());
    let victim = asked().unwrap();
    let slot = f.wins().keys().next().cloned().expect("a slot was won");
    boards.remove(victim).kill9().await;
    // The other boards go on with the next slots; the killed slot is never won again.
    assert!(wait_until(60, || f.wins().len() >= 3).await, "{}", f.all_logs());
    boards.insert(victim, f.start_board(victim));
    assert!(wait_until(30, || f.all_logs().contains("interrupted")).await, "{}", f.all_logs());
    assert!(wait_until(30, || f.wins().len() >= 4).await, "{}", f.all_logs());
    f.assert_once();
    assert_eq!(f.wins().get(&slot), Some(&1), "{}", f.all_logs());
    let turns: usize = f.llms.iter().map(|l| l.request_count()).sum();
    assert!(turns <= f.wins().len(), "{turns} turns for {} slots", f.wins().len());
    drop(boards);
}

#[tokio::test]
async fn a_board_cut_from_nats_runs_nothing_says_why_and_alerts_once() {
    let mut nats = Nats::start().await;
    let f = fleet(&nats.url()).await;
    let boards = f.start().await;
    f.add_any(&["cut", "--every", "2s", "--remind", "cut-tick", "--deliver", "telegram:4242"]).await;
    assert!(wait_until(60, || f.wins().len() >= 2).await, "{}", f.all_logs());
    nats.kill();
    let won = f.wins().len();
    let why = "not run: cannot claim the slot in NATS";
    for b in &boards {
        assert!(b.wait_log_count(why, 3, 60).await, "{}", b.log());
    }
    // A slot in flight at the kill may still have been won; none after the warnings.
    let after_cut = f.wins().len();
    assert!(after_cut <= won + 1, "{after_cut} vs {won}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(f.wins().len(), after_cut, "nothing is run while NATS is away: {}", f.all_logs());
    // One alert for the outage in the primary's chat, however many slots passed.
    let alert = "Alert: living cannot reach NATS";
    assert!(wait_until(30, || f.sent_with(alert) == 1).await, "{:?}", f.tg.sent_texts());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(f.sent_with(alert), 1, "{:?}", f.tg.sent_texts());
    // NATS back (same store): slots are claimed again, each once, and the recovery is said.
    nats.launch().await;
    assert!(wait_until(60, || f.wins().len() >= after_cut + 2).await, "{}", f.all_logs());
    assert!(wait_until(30, || f.sent_with("living reaches NATS again") == 1).await, "{:?}", f.tg.sent_texts());
    f.assert_once();
    drop(boards);
}

#[tokio::test]
async fn a_forged_or_replayed_job_for_any_board_is_refused() {
    let nats = Nats::start().await;
    let f = fleet(&nats.url()).await;
    let boards = f.start().await;
    let spy = Watcher::start(f.broker.port, &["bramble/living/fleet/cmd/#"]).await;
    f.add_any(&["real", "--in", "1h", "--remind", "real one"]).await;
    let sent = spy.on("bramble/living/fleet/cmd/garage");
    let add = sent.iter().find(|s| s.payload.contains("cron.add")).expect("the cron.add was seen").clone();
    // Replayed as it was: refused (its nonce was seen).
    spy.publish("bramble/living/fleet/cmd/garage", &add.payload).await;
    assert!(boards[1].wait_log("its nonce was seen before", 20).await, "{}", boards[1].log());
    // A rogue's job for any board, signed with another key.
    let topic = "bramble/living/fleet/cmd/shed";
    let (living, shed) = ("living".parse().unwrap(), "shed".parse().unwrap());
    let rogue = bramble::fleet::auth::Signer::new(b"not-the-fleet-key-not-the-fleet-key-00");
    let body = add.payload.clone();
    let job: serde_json::Value = serde_json::from_str(&body).unwrap();
    let forged_body = job["body"].as_str().unwrap().replace("real one", "rogue one").replace("\"real\"", "\"rogue\"");
    let forged = rogue.seal(topic, &living, &shed, "cron.add", "0123456789abcdef", forged_body);
    spy.publish(topic, &serde_json::to_string(&forged).unwrap()).await;
    assert!(boards[2].wait_log("the signature does not match", 20).await, "{}", boards[2].log());
    for i in 0..3 {
        let list = text(&f.cli(i, &["cron", "list"]).await);
        assert!(list.contains("real") && !list.contains("rogue"), "{list}");
    }
}

/// A fake NATS server: INFO, PONG to the handshake's PING, then `answer` to the first publish.
async fn fake_nats(answer: Vec<u8>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut lines = BufReader::new(r).lines();
                let info =
                    "INFO {\"server_id\":\"fake\",\"version\":\"2.9.10\",\"headers\":true,\"max_payload\":1048576}\r\n";
                let _ = w.write_all(info.as_bytes()).await;
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == "PING" {
                        let _ = w.write_all(b"PONG\r\n").await;
                    } else if let Some(rest) = line.strip_prefix("HPUB ").or_else(|| line.strip_prefix("PUB ")) {
                        let reply = rest.split_whitespace().nth(1).unwrap_or("_INBOX.x").to_string();
                        let _ = lines.next_line().await; // the headers and payload (one line here)
                        let head = format!("MSG {reply} 1 {}\r\n", answer.len());
                        let _ = w.write_all(head.as_bytes()).await;
                        let _ = w.write_all(&answer).await;
                        let _ = w.write_all(b"\r\n").await;
                    }
                }
            });
        }
    });
    port
}

/// A dead peer: it accepts the connection and never says a word.
async fn silent_nats() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    port
}

#[tokio::test]
async fn a_malformed_oversize_or_missing_answer_from_nats_is_a_clear_error_and_runs_nothing() {
    for (answer, said) in [
        (Some(b"<html>not json</html>".to_vec()), "not JSON"),
        (Some(vec![b'x'; 200_000]), "over the 65536-byte limit"),
        (None, "no answer within 10 s (the handshake)"),
    ] {
        let port = match answer {
            Some(answer) => fake_nats(answer).await,
            None => silent_nats().await,
        };
        let f = fleet(&format!("nats://127.0.0.1:{port}")).await;
        let living = f.start_board(0);
        assert!(living.wait_log("MQTT connected", 30).await, "{}", living.log());
        let out = f.cli(0, &["cron", "add", "odd", "--every", "2s", "--remind", "odd-tick", "--on", "any"]).await;
        assert!(out.status.success(), "{}", text(&out));
        assert!(living.wait_log(said, 30).await, "{}", living.log());
        assert!(living.log().contains("not run: cannot claim the slot in NATS"), "{}", living.log());
        assert!(f.wins().is_empty(), "{}", f.all_logs());
        living.stop().await;
    }
}

#[tokio::test]
async fn a_board_whose_nats_account_cannot_reach_the_bucket_runs_nothing_and_says_why() {
    let nats = Nats::start_with_accounts().await;
    let f = fleet_with(&nats.url(), true).await;
    let boards = f.start().await;
    f.add_any(&["acl", "--every", "2s", "--remind", "acl-tick"]).await;
    assert!(boards[2].wait_log_count("Permissions Violation", 2, 60).await, "{}", boards[2].log());
    assert!(boards[2].log().contains("not run: cannot claim the slot in NATS"), "{}", boards[2].log());
    assert!(wait_until(60, || f.wins().len() >= 3).await, "{}", f.all_logs());
    f.assert_once();
    assert!(!boards[2].log().contains(WON), "the shed's account cannot claim: {}", boards[2].log());
    assert!(boards[0].log().contains(WON) || boards[1].log().contains(WON), "{}", f.all_logs());
}

/// Voluntary context switches of all the daemon's threads over 60 s (after
/// 10 s to settle), and RSS: a measurement for docs/fleet.md, not a check:
/// `cargo test --test it fleet_any::idle -- --ignored --nocapture`.
async fn idle_sample(f: &Fleet) -> (u64, u64) {
    let node = f.start_board(1);
    assert!(node.wait_log("MQTT connected", 30).await, "{}", node.log());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = crate::support::procstat::sample(node.pid());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = crate::support::procstat::sample(node.pid());
    node.stop().await;
    (after.woke_since(&before), after.rss_kib)
}

#[tokio::test]
#[ignore = "a 140 s measurement for docs/fleet.md, not a check"]
async fn idle_cost_of_a_node_with_nats() {
    let nats = Nats::start().await;
    let with = fleet(&nats.url()).await;
    let (woke, rss) = idle_sample(&with).await;
    println!("| node with nats_url | {woke} | {:.1} MB |", rss as f64 / 1024.0);
    let without = fleet_with("", false).await;
    let cfg = std::fs::read_to_string(&without.homes[1].config).unwrap().replace("nats_url = \"\"\n", "");
    std::fs::write(&without.homes[1].config, cfg).unwrap();
    let (woke, rss) = idle_sample(&without).await;
    println!("| node without | {woke} | {:.1} MB |", rss as f64 / 1024.0);
}
