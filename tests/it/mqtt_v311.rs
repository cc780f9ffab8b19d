//! MQTT 3.1.1 (`[mqtt] protocol`) against a second, 3.1.1-only broker (amqtt
//! from PyPI), mosquitto spoken to in 3.1.1, and fake brokers that misbehave
//! (built from the MQTT 3.1.1 and 5.0 OASIS standards' CONNECT/CONNACK
//! layouts, §3.1 and §3.2 of each): the fallback in `auto`, a clear error
//! for `protocol = "5"` against a 3.1.1 broker, and what stands in for MQTT
//! 5's packet limits.

use std::path::PathBuf;

use crate::support::amqtt::Amqtt;
use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::{bramble, TestHome};

const STATUS: &str = "bramble/testpi/status";
const OUT: &str = "bramble/testpi/out";

struct Setup {
    fake: FakeLlm,
    home: TestHome,
    log: PathBuf,
}

impl Setup {
    async fn new(url: &str, mqtt_extra: &str) -> Setup {
        let fake = FakeLlm::start(Dialect::OpenAi).await;
        let extra = format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [mqtt]\nurl = \"{url}\"\ndevice = \"testpi\"\ndiscovery = false\n{mqtt_extra}\n"
        );
        let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
        let log = home.path().join("daemon.log");
        Setup { fake, home, log }
    }

    fn start(&self) -> Daemon {
        Daemon::start_logging_to(self.home.path(), Some(&self.home.config), &self.log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `bramble COMMAND`'s lines that mention mqtt, whatever its exit code.
    async fn mqtt_lines(&self, command: &str) -> String {
        let config = self.home.config.to_string_lossy().into_owned();
        let out = bramble(self.home.path(), &["--config", &config, command], None).await;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        text.lines().filter(|l| l.contains("mqtt")).collect::<Vec<_>>().join("\n")
    }

    async fn doctor_mqtt(&self) -> String {
        self.mqtt_lines("doctor").await
    }
}

/// The channel's core over a 3.1.1 connection: retained `online`, the last
/// will, `<prefix>/in` to `<prefix>/out`, and the start-up line naming the version.
async fn core_works(s: &Setup, port: u16, version: &str) {
    s.fake.push(Reply::text("pong"));
    let daemon = s.start();
    let w = Watcher::start(port, &[STATUS, OUT]).await;
    assert!(w.wait_last(30, STATUS, "online").await, "online: {}", s.log());
    assert!(s.log().contains(&format!("MQTT connected ({version})")), "{}", s.log());
    w.publish("bramble/testpi/in", "ping").await;
    assert!(w.wait_for(15, OUT, |p| p == "pong").await, "{}", s.log());
    let log = daemon.kill9().await;
    assert!(w.wait_last(15, STATUS, "offline").await, "the last will: {log}");
}

#[tokio::test]
async fn auto_falls_back_to_3_1_1_on_a_broker_that_speaks_only_that() {
    let broker = Amqtt::start().await;
    let s = Setup::new(&broker.url(), "").await;
    let doctor = s.doctor_mqtt().await;
    assert!(doctor.contains("MQTT 3.1.1: the broker does not speak MQTT 5"), "{doctor}");
    assert!(!doctor.contains("password") && !doctor.contains("check [mqtt] url"), "{doctor}");
    core_works(&s, broker.port, "MQTT 3.1.1").await;
    assert!(s.log().contains("asking again in MQTT 3.1.1"), "{}", s.log());
}

#[tokio::test]
async fn forced_5_against_a_3_1_1_broker_says_so_and_what_to_set() {
    let broker = Amqtt::start().await;
    let s = Setup::new(&broker.url(), "protocol = \"5\"").await;
    let doctor = s.doctor_mqtt().await;
    assert!(doctor.contains("speaks only MQTT 3.1.1") && doctor.contains("protocol = \"auto\""), "{doctor}");
    assert!(!doctor.contains("password"), "the password is not blamed: {doctor}");
    let daemon = s.start();
    assert!(wait_until(30, || s.log().contains("set [mqtt] protocol = \"auto\" or \"3.1.1\"")).await, "{}", s.log());
    assert!(!s.log().contains("MQTT connected"), "{}", s.log());
    daemon.stop().await;
}

#[tokio::test]
async fn forced_3_1_1_against_mosquitto() {
    let broker = Mosquitto::start().await;
    let s = Setup::new(&broker.url(), "protocol = \"3.1.1\"").await;
    let doctor = s.doctor_mqtt().await;
    assert!(doctor.contains("(MQTT 3.1.1, plain)"), "{doctor}");
    let status = s.mqtt_lines("status").await;
    assert!(status.contains("MQTT 3.1.1"), "{status}");
    core_works(&s, broker.port, "MQTT 3.1.1").await;
}

#[tokio::test]
async fn auto_speaks_5_to_mosquitto() {
    let broker = Mosquitto::start().await;
    let s = Setup::new(&broker.url(), "").await;
    let doctor = s.doctor_mqtt().await;
    assert!(doctor.contains("(MQTT 5, plain)"), "{doctor}");
    core_works(&s, broker.port, "MQTT 5").await;
}

/// In 3.1.1 the broker cannot announce its packet limit: mosquitto with
/// `message_size_limit` silently drops a larger 3.1.1 publish. `max_packet`
/// set to the broker's limit refuses it before it is sent, as an error that
/// names the setting (the outbox sets it aside), and the next report goes out.
#[tokio::test]
async fn a_3_1_1_broker_that_drops_oversize_packets_and_max_packet() {
    let broker = Mosquitto::start_with("message_size_limit 2000").await;
    let s = Setup::new(&broker.url(), "protocol = \"3.1.1\"\nmax_packet = 2000").await;
    let w = Watcher::start(broker.port, &[STATUS, OUT]).await;
    let daemon = s.start();
    assert!(w.wait_last(30, STATUS, "online").await, "{}", s.log());
    let config = s.home.config.to_string_lossy().into_owned();
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    let big = "x".repeat(5000);
    for (name, text) in [("big", big.as_str()), ("small", "small report")] {
        let args = ["--config", &config, "cron", "add", name, "--at", &at, "--remind", text, "--deliver", "mqtt"];
        let out = bramble(s.home.path(), &args, None).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(w.wait_for(30, OUT, |p| p == "small report").await, "{}", s.log());
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(wait_until(10, || outbox.pending().is_ok_and(|p| p.is_empty())).await, "{:?}", outbox.pending());
    let recent = outbox.recent().unwrap();
    let set_aside = recent.iter().find(|d| d.source.to_string() == "job:big").expect("recorded");
    assert!(set_aside.outcome.contains("[mqtt] max_packet"), "{}", set_aside.outcome);
    assert!(w.on(OUT).iter().all(|m| m.payload.len() < 2000), "nothing oversize went out");
    daemon.stop().await;
    assert!(!s.log().contains("MQTT connection lost"), "{}", s.log());
}

/// A fake broker: answers every CONNECT with `reply(protocol level)` and hangs up.
async fn fake_broker(reply: fn(u8) -> Vec<u8>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 512];
            let Ok(n) = sock.read(&mut buf).await else { continue };
            // CONNECT: fixed header (2 bytes for a short one), "\0\x04MQTT", then the level.
            let level = if n > 8 { buf[8] } else { 0 };
            let _ = sock.write_all(&reply(level)).await;
            let _ = sock.shutdown().await;
        }
    });
    (port, task)
}

/// A broker that lies: it refuses MQTT 5 as "unacceptable protocol version"
/// and then refuses 3.1.1 the same way. Named as what it is, no hot loop.
#[tokio::test]
async fn a_broker_that_refuses_every_version_is_named_and_not_hammered() {
    let (port, _task) = fake_broker(|_| vec![0x20, 0x02, 0x00, 0x01]).await;
    let s = Setup::new(&format!("mqtt://127.0.0.1:{port}"), "").await;
    let doctor = s.doctor_mqtt().await;
    assert!(doctor.contains("asked again in MQTT 3.1.1") && doctor.contains("RefusedProtocolVersion"), "{doctor}");
    let daemon = s.start();
    assert!(wait_until(20, || s.log().matches("cannot connect to the MQTT broker").count() >= 2).await, "{}", s.log());
    let log = s.log();
    assert!(log.matches("asking again in MQTT 3.1.1").count() <= 3, "backs off between tries: {log}");
    daemon.stop().await;
}

/// Malformed CONNACKs (wrong length, a PUBLISH instead, garbage): a clear
/// error in doctor and the daemon keeps trying with backoff, never connected.
#[tokio::test]
async fn a_malformed_connack_is_a_clear_error() {
    for reply in [
        (|_| vec![0x20, 0x05, 0x00]) as fn(u8) -> Vec<u8>,
        |_| vec![0x30, 0x03, 0x00, 0x01, b'x'],
        |_| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(),
    ] {
        let (port, task) = fake_broker(reply).await;
        let s = Setup::new(&format!("mqtt://127.0.0.1:{port}"), "").await;
        let doctor = s.doctor_mqtt().await;
        assert!(doctor.contains("asked again in MQTT 3.1.1") || doctor.contains("check [mqtt] url"), "{doctor}");
        assert!(!doctor.contains("connected to"), "{doctor}");
        task.abort();
    }
}
