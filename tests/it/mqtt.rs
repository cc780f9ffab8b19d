//! MQTT against a real broker (Debian's mosquitto) and a real `bramble run`:
//! status and last will, `<prefix>/in`, `<prefix>/run/<job>` and job records,
//! triggers, `mqtt_publish`, Home Assistant discovery, and a broker outage.

use std::path::PathBuf;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::TestHome;
use serde_json::Value;

const STATUS: &str = "bramble/testpi/status";
const OUT: &str = "bramble/testpi/out";

struct Setup {
    broker: Mosquitto,
    fake: FakeLlm,
    home: TestHome,
    log: PathBuf,
}

impl Setup {
    /// A broker, a fake LLM and a config with `[mqtt]` (plus `mqtt_extra` keys and sections).
    async fn new(mqtt_extra: &str) -> Setup {
        Setup::with_broker(Mosquitto::start().await, mqtt_extra).await
    }

    async fn with_broker(broker: Mosquitto, mqtt_extra: &str) -> Setup {
        let fake = FakeLlm::start(Dialect::OpenAi).await;
        let extra = format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [mqtt]\nurl = \"{}\"\ndevice = \"testpi\"\n{mqtt_extra}\n",
            broker.url()
        );
        let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
        let log = home.path().join("daemon.log");
        Setup { broker, fake, home, log }
    }

    fn start(&self) -> Daemon {
        Daemon::start_logging_to(self.home.path(), Some(&self.home.config), &self.log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn cli(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&self.home.config)
            .args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .await
            .expect("bramble");
        assert!(out.status.success(), "bramble {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The text of every LLM request, as JSON text (to search in).
    fn llm_requests(&self) -> Vec<String> {
        self.fake.requests().iter().map(Value::to_string).collect()
    }
}

#[tokio::test]
async fn status_is_retained_online_and_offline_is_the_last_will() {
    let s = Setup::new("discovery = false").await;
    let status = s.cli(&["status"]).await;
    let expected =
        format!("mqtt://127.0.0.1:{} as `testpi`, topics bramble/testpi/… (broker reachable)", s.broker.port);
    assert!(status.contains(&expected), "{status}");
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "online: {}", s.log());
    // A late subscriber gets the retained status.
    let late = Watcher::start(s.broker.port, &[STATUS]).await;
    assert!(late.wait_last(5, STATUS, "online").await);
    assert!(late.on(STATUS).iter().all(|m| m.retain));

    // Killed without a goodbye: the broker publishes the last will.
    let log = daemon.kill9().await;
    assert!(w.wait_last(10, STATUS, "offline").await, "last will: {log}");
    let late = Watcher::start(s.broker.port, &[STATUS]).await;
    assert!(late.wait_last(5, STATUS, "offline").await, "the will is retained");

    // A clean stop says `offline` itself (a clean DISCONNECT fires no will).
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await);
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert!(w.wait_last(5, STATUS, "offline").await, "{}", s.log());
}

/// The keep-alive: after rumqttc's first PINGREQ the daemon sends them on its
/// own timer (src/channels/mqtt/keepalive.rs). The broker (its log, at
/// `log_type all`) must hear one within every keep-alive and never drop the
/// daemon; a broker that stops answering (SIGSTOP) must be noticed and left.
#[tokio::test]
async fn pings_keep_the_connection_and_a_silent_broker_is_noticed() {
    let logs = tempfile::tempdir().unwrap();
    // mosquitto started as root writes its log as its own user.
    std::fs::set_permissions(logs.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let broker_log = logs.path().join("mosquitto.log");
    let broker = Mosquitto::start_with(&format!("log_type all\nlog_dest file {}\n", broker_log.display())).await;
    let s = Setup::with_broker(broker, "discovery = false\nkeep_alive = \"5s\"").await;
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "online: {}", s.log());

    // Four keep-alives and more: rumqttc's one ping, then the daemon's.
    tokio::time::sleep(std::time::Duration::from_secs(23)).await;
    let text = std::fs::read_to_string(&broker_log).unwrap_or_default();
    let pings: Vec<u64> = text
        .lines()
        .filter(|l| l.ends_with("Received PINGREQ from testpi"))
        .filter_map(|l| l.split(':').next()?.parse().ok())
        .collect();
    assert!(pings.len() >= 4, "a PINGREQ every 5 s: {pings:?}\n{text}");
    // The broker's log has whole seconds; 1.5 × 5 s is its limit.
    for pair in pings.windows(2) {
        assert!(pair[1] - pair[0] <= 7, "pings {pair:?} too far apart: {pings:?}");
    }
    assert!(!text.contains("exceeded timeout"), "{text}");
    assert!(!s.log().contains("MQTT connection lost"), "{}", s.log());
    assert!(w.on(STATUS).iter().all(|m| m.payload == "online"), "{:?}", w.on(STATUS));

    // A broker that hangs: the next ping finds the last one unanswered.
    let pid = nix::unistd::Pid::from_raw(s.broker.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let noticed = wait_until(20, || s.log().contains("MQTT connection lost")).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(noticed, "{}", s.log());
    assert!(wait_until(30, || s.log().matches("MQTT connected").count() >= 2).await, "{}", s.log());
    daemon.stop().await;
}

#[tokio::test]
async fn messages_on_in_get_replies_on_out_or_reply_to() {
    let s = Setup::new("discovery = false").await;
    s.fake.push(Reply::text("pong one"));
    s.fake.push(Reply::text("pong two"));
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT, "test/reply"]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());

    w.publish("bramble/testpi/in", "ping as text").await;
    assert!(w.wait_for(15, OUT, |p| p == "pong one").await, "{}", s.log());
    w.publish("bramble/testpi/in", r#"{"text":"ping as json","session":"kitchen","reply_to":"test/reply"}"#).await;
    assert!(w.wait_for(15, "test/reply", |p| p == "pong two").await, "{}", s.log());

    let reqs = s.llm_requests();
    assert!(reqs[0].contains("ping as text"), "{}", reqs[0]);
    assert!(reqs[1].contains("ping as json") && !reqs[1].contains("ping as text"), "own session: {}", reqs[1]);
    // Bad input is logged and loses nothing else.
    w.publish("bramble/testpi/in", r#"{"text": broken"#).await;
    assert!(wait_until(5, || s.log().contains("MQTT message ignored")).await);
    daemon.stop().await;
    let sessions = s.home.state.join("sessions");
    assert!(std::fs::read_dir(&sessions).unwrap().count() >= 2, "two sessions were written");
}

#[tokio::test]
async fn run_topic_runs_a_job_records_it_and_discovery_follows_the_jobs() {
    let s = Setup::new("discovery = true").await;
    let button = "homeassistant/button/bramble_testpi/run_ping/config";
    let w =
        Watcher::start(s.broker.port, &[STATUS, "bramble/testpi/jobs/+", "bramble/testpi/last_job", "homeassistant/#"])
            .await;
    s.cli(&["cron", "add", "ping", "--every", "1h", "--exec", "echo ran-by-mqtt", "--ha-button"]).await;
    // Buttons only for jobs marked for one, at most MAX_BUTTONS of them (more
    // retained documents than rumqttc's request queue holds at once).
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    let cap = bramble::channels::mqtt::discovery::MAX_BUTTONS;
    for i in 0..100 {
        let schedule = bramble::scheduler::Schedule::Every {
            every: bramble::scheduler::parse_every("1d").unwrap(),
            anchor: jiff::Timestamp::now(),
        };
        let kind = bramble::scheduler::JobKind::Remind { text: "x".into() };
        let now = jiff::Timestamp::now();
        let mut job =
            bramble::scheduler::Job::new(&format!("bulk-{i}"), schedule, kind, vec![], now, &jiff::tz::TimeZone::UTC)
                .unwrap();
        job.ha_button = i < 60;
        store.add(job).unwrap();
    }
    // A button an earlier version published for an unmarked job.
    let old = "homeassistant/button/bramble_testpi/run_bulk-99/config";
    w.publish_retained(old, r#"{"name":"Run bulk-99","command_topic":"bramble/testpi/run/bulk-99"}"#).await;
    assert!(w.wait_for(10, old, |p| !p.is_empty()).await);
    // Another board's, under the same node (`test pi` before node ids were told apart): not ours to delete.
    let other = "homeassistant/button/bramble_testpi/run_theirs/config";
    w.publish_retained(other, r#"{"name":"Run theirs","command_topic":"bramble/test pi/run/theirs"}"#).await;
    assert!(w.wait_for(10, other, |p| !p.is_empty()).await);
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    let bulk = |i: usize| format!("homeassistant/button/bramble_testpi/run_bulk-{i}/config");
    // `ping` is the first marked job; then bulk-0 … up to the cap.
    let capped = || (0..cap - 1).all(|i| !w.on(&bulk(i)).is_empty());
    assert!(wait_until(15, capped).await, "a button for each marked job up to the cap: {}", s.log());
    assert!(w.wait_last(10, old, "").await, "the old version's button is cleared: {}", s.log());
    assert!(w.last(other).is_some_and(|p| p.contains("theirs")), "another board's document stays: {}", s.log());
    assert!((cap - 1..99).all(|i| w.on(&bulk(i)).is_empty()), "no button beyond the cap or for unmarked jobs");
    assert!(s.log().contains("61 jobs are marked for a button; only the first 50 get one"), "{}", s.log());

    // Device, sensors and the job's button.
    assert!(w.wait_for(10, button, |p| p.contains("bramble/testpi/run/ping")).await, "{}", s.log());
    let status_doc = w.last("homeassistant/binary_sensor/bramble_testpi/status/config").expect("status sensor");
    let doc: Value = serde_json::from_str(&status_doc).unwrap();
    assert_eq!(doc["device_class"], "connectivity");
    assert_eq!(doc["state_topic"], STATUS);
    assert_eq!(doc["device"]["identifiers"][0], "bramble_testpi");
    assert!(w.last("homeassistant/sensor/bramble_testpi/last_heartbeat/config").is_some());
    assert!(w.last("homeassistant/sensor/bramble_testpi/last_job/config").is_some());

    // Pressing the button runs the job; the record is retained JSON.
    w.publish("bramble/testpi/run/ping", "PRESS").await;
    assert!(w.wait_for(20, "bramble/testpi/jobs/ping", |p| p.contains("ran-by-mqtt")).await, "{}", s.log());
    let record: Value = serde_json::from_str(&w.last("bramble/testpi/jobs/ping").unwrap()).unwrap();
    assert_eq!(record["job"], "ping");
    assert_eq!(record["status"], "ok");
    assert!(record["started"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()), "{record}");
    assert!(record["finished"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()), "{record}");
    assert!(w.wait_for(5, "bramble/testpi/last_job", |p| p.contains("\"ping\"")).await);
    // A run request for an unknown job is refused in the log.
    w.publish("bramble/testpi/run/nope", "PRESS").await;
    assert!(wait_until(5, || s.log().contains("cannot run the job")).await);

    // Removed while running: the button and the record are deleted (empty retained).
    s.cli(&["cron", "remove", "ping"]).await;
    assert!(w.wait_last(10, button, "").await, "button cleared: {}", s.log());
    assert!(w.wait_last(10, "bramble/testpi/jobs/ping", "").await, "record cleared");

    // Removed while the daemon was down: cleared at the next start.
    let gone = bulk(0);
    assert!(w.wait_for(10, &gone, |p| !p.is_empty()).await);
    daemon.stop().await;
    s.cli(&["cron", "remove", "bulk-0"]).await;
    let daemon = s.start();
    assert!(w.wait_last(15, &gone, "").await, "leftover cleared: {}", s.log());
    daemon.stop().await;
}

#[tokio::test]
async fn triggers_render_json_fields_run_commands_and_drop_bursts() {
    let s = Setup::new(
        r#"discovery = false
[[mqtt.trigger]]
topic = "zigbee/+/door"
message = "Door contact={payload.contact} on {topic}, battery {payload.battery}%, {payload.missing}"
deliver = ["mqtt:test/door"]
min_interval = "1h"

[[mqtt.trigger]]
topic = "sensors/raw"
exec = "cat > trigger-stdin.txt; echo exec saw $(wc -c < trigger-stdin.txt) bytes"
deliver = ["mqtt:test/exec"]
min_interval = "0s"
"#,
    )
    .await;
    s.fake.push(Reply::text("The door is open."));
    let w = Watcher::start(s.broker.port, &[STATUS, "test/door", "test/exec"]).await;
    // Old state, retained on the broker: replayed on subscribe, but not an event.
    w.publish_retained("sensors/raw", "stale retained state").await;
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());

    for _ in 0..5 {
        w.publish("zigbee/front/door", r#"{"contact":false,"battery":97}"#).await;
    }
    assert!(w.wait_for(15, "test/door", |p| p == "The door is open.").await, "{}", s.log());
    let reqs = s.llm_requests();
    assert!(
        reqs[0].contains("Door contact=false on zigbee/front/door, battery 97%, (no field `missing` in the payload)"),
        "{}",
        reqs[0]
    );
    // The burst: one run, four dropped and logged.
    assert!(wait_until(5, || s.log().matches("trigger rate-limited").count() == 4).await, "{}", s.log());

    // A later message (an exec trigger: no model call) is handled after the burst.
    w.publish("sensors/raw", "hello from a sensor").await;
    assert!(w.wait_for(15, "test/exec", |p| p.contains("exec saw 19 bytes")).await, "{}", s.log());
    assert_eq!(s.fake.request_count(), 1, "one LLM call for the burst");
    let stdin = std::fs::read_to_string(s.home.workspace.join("trigger-stdin.txt")).unwrap();
    assert_eq!(stdin, "hello from a sensor");
    assert_eq!(w.on("test/exec").len(), 1, "the retained message did not run the trigger");
    assert_eq!(s.fake.request_count(), 1, "exec triggers call no LLM");
    daemon.stop().await;
}

#[tokio::test]
async fn mqtt_publish_is_limited_to_allowed_topics() {
    // MQTT turns are offered mqtt_publish only when the policy says so.
    let s = Setup::new(
        "discovery = false\npublish_allow = [\"lights/+/set\"]\n[policy.mqtt]\ndeny = [\"exec\", \"write_file\", \"edit_file\"]",
    )
    .await;
    s.fake.push(Reply::tool_call("mqtt_publish", r#"{"topic":"lights/kitchen/set","payload":"ON"}"#));
    s.fake.push(Reply::tool_call("mqtt_publish", r#"{"topic":"locks/front/set","payload":"OPEN"}"#));
    s.fake.push(Reply::text("Light on; the lock is not mine to open."));
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT, "lights/#", "locks/#"]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());

    w.publish("bramble/testpi/in", "light on, unlock the door").await;
    assert!(w.wait_for(15, OUT, |p| p.starts_with("Light on")).await, "{}", s.log());
    assert_eq!(w.last("lights/kitchen/set").as_deref(), Some("ON"));
    assert!(w.on("locks/front/set").is_empty());
    let reqs = s.llm_requests();
    assert!(reqs[1].contains("Published 2 bytes to `lights/kitchen/set`"), "{}", reqs[1]);
    assert!(reqs[2].contains("publishing to `locks/front/set` is not allowed"), "{}", reqs[2]);
    daemon.stop().await;
}

#[tokio::test]
async fn a_broker_outage_loses_nothing() {
    let mut s = Setup::new("discovery = false").await;
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT, "bramble/testpi/heartbeat"]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());

    s.broker.kill();
    w.clear();
    assert!(wait_until(10, || s.log().contains("MQTT connection lost")).await, "{}", s.log());
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    s.cli(&["cron", "add", "outage", "--at", &at, "--remind", "queued while the broker was down", "--deliver", "mqtt"])
        .await;
    s.cli(&["cron", "add", "outage2", "--at", &at, "--remind", "and this one too", "--deliver", "mqtt"]).await;
    // The reports fail as retryable and stay in the outbox.
    assert!(wait_until(20, || s.log().matches("delivery failed; will retry").count() >= 2).await, "{}", s.log());
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert_eq!(outbox.pending().unwrap().len(), 2);

    s.broker.restart().await;
    // Retained state was lost with the broker: the daemon publishes it again.
    assert!(w.wait_last(30, STATUS, "online").await, "{}", s.log());
    assert!(w.wait_for(60, OUT, |p| p == "queued while the broker was down").await, "{}", s.log());
    assert!(w.wait_for(30, OUT, |p| p == "and this one too").await, "{}", s.log());
    assert!(wait_until(10, || outbox.pending().is_ok_and(|p| p.is_empty())).await);
    // They did not wait out their backoff: the reconnect made them due.
    assert!(s.log().contains("MQTT is back: sending the reports that waited"), "{}", s.log());
    daemon.stop().await;
}

#[tokio::test]
async fn mqtts_verifies_the_broker_certificate() {
    let (broker, ca) = Mosquitto::start_tls().await;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let tls_port = broker.tls_port.expect("tls");
    let extra = format!(
        "[heartbeat]\nenabled = false\n[mqtt]\nurl = \"mqtts://localhost:{tls_port}\"\ndevice = \"testpi\"\ndiscovery = false\n"
    );
    let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
    let log = home.path().join("daemon.log");
    let w = Watcher::start(broker.port, &[STATUS]).await;

    // The test CA is not a system root: the connection is refused.
    let daemon = Daemon::start_logging_to(home.path(), Some(&home.config), &log);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(wait_until(15, || read().contains("cannot connect to the MQTT broker")).await, "{}", read());
    assert!(read().to_lowercase().contains("certificate"), "says why: {}", read());
    assert!(w.on(STATUS).is_empty());
    daemon.stop().await;

    // Trusted (rustls-native-certs reads SSL_CERT_FILE): connected over TLS.
    let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, &[("SSL_CERT_FILE", &ca)]);
    assert!(w.wait_last(15, STATUS, "online").await, "{}", read());
    daemon.stop().await;
    assert!(w.wait_last(5, STATUS, "offline").await);
}

#[tokio::test]
async fn alerts_go_to_the_alert_topic_and_drive_the_problem_sensor() {
    let s = Setup::new("discovery = true\n[alerts]\ndeliver = [\"mqtt\"]\nafter_failures = 1").await;
    let (problem, alert) = ("bramble/testpi/problem", "bramble/testpi/alert");
    let doc = "homeassistant/binary_sensor/bramble_testpi/problem/config";
    let w = Watcher::start(s.broker.port, &[STATUS, problem, alert, doc]).await;
    s.cli(&["cron", "add", "flaky", "--every", "1d", "--exec", "test -e fixed"]).await;
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    let sensor: Value = serde_json::from_str(&w.last(doc).expect("problem sensor announced")).unwrap();
    assert_eq!(sensor["device_class"], "problem");
    assert_eq!(sensor["state_topic"], problem);
    let state = |p: &str| serde_json::from_str::<Value>(p).map(|v| v["state"].clone()).unwrap_or_default();
    assert!(w.wait_for(10, problem, |p| state(p) == "OFF").await, "nothing open at start: {}", s.log());

    // It fails: one alert, and the sensor turns on with the alert as an attribute.
    w.publish("bramble/testpi/run/flaky", "PRESS").await;
    assert!(w.wait_for(20, alert, |p| p.contains("job `flaky` has failed 1 time in a row")).await, "{}", s.log());
    assert!(w.wait_for(10, problem, |p| state(p) == "ON" && p.contains("flaky")).await, "{}", s.log());
    // Failing again is the same incident: no second alert.
    w.publish("bramble/testpi/run/flaky", "PRESS").await;
    assert!(wait_until(20, || s.log().matches("job finished").count() >= 2).await, "{}", s.log());

    // Fixed: one recovery note, and the sensor turns off.
    std::fs::write(s.home.workspace.join("fixed"), "").unwrap();
    w.publish("bramble/testpi/run/flaky", "PRESS").await;
    assert!(w.wait_for(20, alert, |p| p.starts_with("Recovered: job `flaky` works again")).await, "{}", s.log());
    assert!(w.wait_last(10, problem, r#"{"problems":[],"state":"OFF"}"#).await, "{:?}", w.last(problem));
    let alerts: Vec<String> = w.on(alert).into_iter().map(|m| m.payload).collect();
    assert_eq!(alerts.len(), 2, "one alert and one note: {alerts:?}");
    daemon.stop().await;
}

#[tokio::test]
async fn inbound_off_listens_to_neither_in_nor_run_but_triggers_still_work() {
    let s = Setup::new(
        "discovery = true\ninbound = false\n\
         [[mqtt.trigger]]\ntopic = \"sensors/door\"\nexec = \"cat >> door.txt\"\nmin_interval = \"0s\"",
    )
    .await;
    let button = "homeassistant/button/bramble_testpi/run_ping/config";
    let w = Watcher::start(s.broker.port, &[STATUS, OUT, button]).await;
    s.cli(&["cron", "add", "ping", "--every", "1h", "--exec", "echo ran >> ping.txt", "--ha-button"]).await;
    // A button an earlier run published while inbound was on: cleared.
    w.publish_retained(button, r#"{"name":"Run ping","command_topic":"bramble/testpi/run/ping"}"#).await;
    assert!(w.wait_for(10, button, |p| !p.is_empty()).await);
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    w.publish("bramble/testpi/in", "hello").await;
    w.publish("bramble/testpi/run/ping", "PRESS").await;
    // The control: a trigger published after them runs, so the two were delivered and dropped.
    w.publish("sensors/door", "open").await;
    let door = s.home.workspace.join("door.txt");
    assert!(wait_until(20, || std::fs::read_to_string(&door).is_ok_and(|t| t.contains("open"))).await, "{}", s.log());
    assert!(w.wait_last(10, button, "").await, "no Run button while inbound is off: {}", s.log());
    daemon.stop().await;
    assert_eq!(s.fake.request_count(), 0, "no agent turn from <prefix>/in");
    assert!(w.on(OUT).is_empty(), "no reply on out");
    assert!(!s.home.workspace.join("ping.txt").exists(), "run/<job> did not run the job");
    assert!(s.log().contains("MQTT inbound is off"), "{}", s.log());
}

/// By default a turn from `<prefix>/in` is offered no tool that changes things,
/// and a call of one anyway is refused (`[policy.mqtt]`).
#[tokio::test]
async fn an_mqtt_turn_gets_no_exec_by_default() {
    let s = Setup::new("discovery = false\npublish_allow = [\"lights/+/set\"]").await;
    s.fake.push(Reply::tool_call("exec", r#"{"command":"touch pwned"}"#));
    s.fake.push(Reply::text("I may not run commands from here."));
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    w.publish("bramble/testpi/in", "run touch pwned").await;
    assert!(w.wait_for(15, OUT, |p| p.starts_with("I may not")).await, "{}", s.log());
    daemon.stop().await;
    let reqs = s.fake.requests();
    let offered: Vec<String> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    for t in ["exec", "write_file", "edit_file", "mqtt_publish"] {
        assert!(!offered.contains(&t.to_string()), "{t} offered: {offered:?}");
    }
    assert!(offered.contains(&"read_file".to_string()) && offered.contains(&"web_fetch".to_string()), "{offered:?}");
    let system = reqs[0]["messages"][0]["content"].as_str().unwrap();
    assert!(!system.contains("exec,") && !system.contains("exec\n"), "the prompt lists only what is offered");
    let result = reqs[1]["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap();
    let text = result["content"].as_str().unwrap();
    assert!(text.starts_with("Error: `exec` is not offered to turns from MQTT ([policy.mqtt]"), "{text}");
    assert!(!s.home.workspace.join("pwned").exists(), "the command never ran");
    // The refused attempt is in the audit trail, with its source.
    let audit = std::fs::read_to_string(s.home.state.join("audit.jsonl")).unwrap();
    assert!(
        audit.contains(r#""tool":"exec","source":"mqtt""#) && audit.contains(r#""ok":false,"detail":"touch pwned""#),
        "{audit}"
    );
}

/// Issue 36: `reply_to` naming a topic bramble listens to. The answer to a
/// message whose `reply_to` is `<prefix>/in` came back as the next message:
/// thousands of model calls in seconds. Such a `reply_to` (and `run/<job>`, a
/// trigger's topic) is refused before the turn; the channel goes on.
#[tokio::test]
async fn an_answer_never_goes_to_a_topic_bramble_listens_to() {
    let s = Setup::new(
        "discovery = false\n[[mqtt.trigger]]\ntopic = \"sensors/door\"\nexec = \"cat >> door.txt\"\nmin_interval = \"0s\"",
    )
    .await;
    // A model that cooperates with the loop: its answer is itself a message to `in`.
    let answer = r#"{"text":"again","reply_to":"bramble/testpi/in"}"#;
    s.fake.route(move |_| Some(Reply::text(answer)));
    let daemon = s.start();
    let inbox = "bramble/testpi/in";
    let w =
        Watcher::start(s.broker.port, &[STATUS, OUT, inbox, "bramble/testpi/run/#", "sensors/#", "elsewhere"]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    for reply_to in [inbox, "bramble/testpi/run/ping", "sensors/door"] {
        w.publish(inbox, &format!(r#"{{"text":"loop me","reply_to":"{reply_to}"}}"#)).await;
    }
    // The control: a message after them is answered where it asks.
    w.publish(inbox, r#"{"text":"hello","reply_to":"elsewhere"}"#).await;
    assert!(w.wait_for(15, "elsewhere", |p| p == answer).await, "{}", s.log());
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    daemon.stop().await;
    assert_eq!(s.fake.request_count(), 1, "one turn: the answered one, no loop");
    assert_eq!(w.on(inbox).len(), 4, "only our own four messages on the input topic");
    assert!(w.on("bramble/testpi/run/ping").is_empty() && w.on("sensors/door").is_empty());
    assert!(!s.home.workspace.join("door.txt").exists(), "the trigger never fired");
    // The answer published to `elsewhere` came back to nobody: only our three were refused.
    assert_eq!(s.log().matches("is one of bramble's own input topics").count(), 3, "{}", s.log());
}

/// Issue 36: a `reply_to` a broker closes the connection on (a NUL), a
/// wildcard, a `$SYS` topic: refused before anything is queued, and the next
/// message is answered. Before, the reply with a NUL took the connection down
/// after every reconnect and the channel stalled.
#[tokio::test]
async fn a_reply_to_against_mqtt_rules_is_refused_and_the_channel_keeps_serving() {
    let s = Setup::new("discovery = false").await;
    s.fake.route(|_| Some(Reply::text("an answer")));
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    for reply_to in ["bad\\u0000topic", "a/+/b", "$SYS/broker/x", "ctl\\u0007"] {
        w.publish("bramble/testpi/in", &format!(r#"{{"text":"hi","reply_to":"{reply_to}"}}"#)).await;
    }
    w.publish("bramble/testpi/in", "and now?").await;
    assert!(w.wait_for(20, OUT, |p| p == "an answer").await, "{}", s.log());
    daemon.stop().await;
    assert_eq!(s.fake.request_count(), 1, "only the good message made a turn");
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(outbox.pending().unwrap().is_empty());
    assert!(outbox.recent().unwrap().iter().all(|d| d.outcome == "delivered"), "{:?}", outbox.recent());
    assert!(!s.log().contains("MQTT connection lost"), "{}", s.log());
    assert_eq!(s.log().matches("MQTT message ignored: reply_to").count(), 4, "{}", s.log());
}

/// Issue 36: a report in the outbox to a topic the broker would disconnect
/// on (as an outbox written by an earlier version holds it) is set aside at
/// once with the reason; the report behind it goes out.
#[tokio::test]
async fn a_report_to_a_topic_the_broker_disconnects_on_is_set_aside_and_the_next_goes_out() {
    let s = Setup::new("discovery = false").await;
    std::fs::create_dir_all(&s.home.state).unwrap();
    let add = |id: u64, target: &str, text: &str| {
        serde_json::json!({"add": {"id": id, "target": target, "text": text, "source": "job:old",
            "created": "2026-01-01T00:00:00Z", "attempts": 0}})
        .to_string()
    };
    let journal = format!("{}\n{}\n", add(1, "mqtt:old/\u{0}/topic", "poison"), add(2, "mqtt", "the next report"));
    std::fs::write(s.home.state.join("outbox.jsonl"), journal).unwrap();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT]).await;
    let daemon = s.start();
    assert!(w.wait_for(20, OUT, |p| p == "the next report").await, "{}", s.log());
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(wait_until(10, || outbox.pending().is_ok_and(|p| p.is_empty())).await, "{:?}", outbox.pending());
    let recent = outbox.recent().unwrap();
    let poison = recent.iter().find(|d| d.id == 1).expect("recorded");
    assert!(poison.outcome.starts_with("dropped: ") && poison.outcome.contains("U+0000"), "{}", poison.outcome);
    daemon.stop().await;
    assert!(!s.log().contains("MQTT connection lost"), "never sent: {}", s.log());
}

/// Issue 36: a report larger than the broker's Maximum Packet Size took the
/// connection down (rumqttc fails the connection on it) after every
/// reconnect, with the job's retained run record too: the channel stalled.
/// Now the broker's limit from the CONNACK is kept: the report is set aside
/// at once with the reason, the record is skipped, the next report goes out.
#[tokio::test]
async fn a_report_larger_than_the_broker_takes_is_set_aside_and_the_next_goes_out() {
    let broker = Mosquitto::start_with("max_packet_size 2000").await;
    let s = Setup::with_broker(broker, "discovery = false").await;
    let w = Watcher::start(s.broker.port, &[STATUS, OUT]).await;
    let daemon = s.start();
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    let big = "x".repeat(5000);
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    s.cli(&["cron", "add", "big", "--at", &at, "--remind", &big, "--deliver", "mqtt"]).await;
    s.cli(&["cron", "add", "small", "--at", &at, "--remind", "small report", "--deliver", "mqtt"]).await;
    assert!(w.wait_for(30, OUT, |p| p == "small report").await, "{}", s.log());
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(wait_until(10, || outbox.pending().is_ok_and(|p| p.is_empty())).await, "{:?}", outbox.pending());
    let recent = outbox.recent().unwrap();
    let set_aside =
        recent.iter().find(|d| d.source == bramble::bus::ReportSource::Job("big".into())).expect("recorded");
    assert!(set_aside.outcome.contains("Maximum Packet Size"), "{}", set_aside.outcome);
    daemon.stop().await;
    assert!(!s.log().contains("MQTT connection lost"), "{}", s.log());
}

/// Issue 36: 200 messages on `<prefix>/in` in a burst start at most
/// `turn_burst` turns (plus what `turns_per_minute` refills meanwhile), and
/// nothing is published back for the dropped ones.
#[tokio::test]
async fn a_flood_on_the_input_topic_starts_only_the_rate_limit_s_turns() {
    let s = Setup::new("discovery = false").await;
    s.fake.route(|_| Some(Reply::text("ok")));
    let daemon = s.start();
    let w = Watcher::start(s.broker.port, &[STATUS, OUT]).await;
    assert!(w.wait_last(15, STATUS, "online").await, "{}", s.log());
    let started = std::time::Instant::now();
    for i in 0..200 {
        w.publish("bramble/testpi/in", &format!("message {i}")).await;
    }
    assert!(w.wait_for(15, OUT, |p| p == "ok").await, "{}", s.log());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let turns = s.fake.request_count();
    // The default: 20 a minute, 5 at once.
    let allowed = 5 + (started.elapsed().as_secs_f64() / 3.0).ceil() as usize;
    assert!((1..=allowed).contains(&turns), "{turns} turns, at most {allowed} allowed: {}", s.log());
    assert_eq!(w.on(OUT).len(), turns, "one answer per turn, nothing for the dropped");
    assert!(s.log().contains("messages are dropped"), "{}", s.log());
    daemon.stop().await;
}

/// Issue 36: bramble's own input topics as delivery targets — `cron add
/// --deliver`, the cron tool, the message tool, mqtt_publish — are refused at
/// once with a clear error, even where publish_allow would allow them.
#[tokio::test]
async fn bramble_s_own_input_topics_are_refused_as_delivery_targets() {
    let s = Setup::new(
        "discovery = false\npublish_allow = [\"#\"]\n\
         [[mqtt.trigger]]\ntopic = \"sensors/+/door\"\nexec = \"cat\"",
    )
    .await;
    for target in ["mqtt:bramble/testpi/in", "mqtt:bramble/testpi/run/backup", "mqtt:sensors/front/door"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&s.home.config)
            .args(["cron", "add", "x", "--every", "1h", "--remind", "hi", "--deliver", target])
            .env_clear()
            .env("HOME", s.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .await
            .expect("bramble");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{target} accepted");
        assert!(err.contains("is one of bramble's own input topics"), "{target}: {err}");
    }
    // The tools, in a terminal turn (every tool offered).
    s.fake.push(Reply::tool_call("message", r#"{"content":"x","target":"mqtt:bramble/testpi/in"}"#));
    s.fake.push(Reply::tool_call(
        "cron",
        r#"{"action":"add","every":"1h","remind":"x","deliver":["mqtt:bramble/testpi/run/backup"]}"#,
    ));
    s.fake.push(Reply::tool_call("mqtt_publish", r#"{"topic":"sensors/back/door","payload":"x"}"#));
    s.fake.push(Reply::text("done"));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .arg("--config")
        .arg(&s.home.config)
        .args(["agent", "-m", "go"])
        .env_clear()
        .env("HOME", s.home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .await
        .expect("bramble");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reqs = s.llm_requests();
    assert_eq!(reqs.len(), 4, "{reqs:?}");
    assert!(reqs[1].contains("is one of bramble's own input topics"), "message: {}", reqs[1]);
    assert!(reqs[2].contains("is one of bramble's own input topics"), "cron: {}", reqs[2]);
    assert!(reqs[3].contains("is one of bramble's own input topics"), "mqtt_publish: {}", reqs[3]);
    assert!(s.cli(&["cron", "list"]).await.contains("no jobs"), "no job was added");
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(outbox.pending().unwrap_or_default().is_empty(), "nothing queued");
}

/// Issue 45: node ids were the device name with other characters replaced
/// by `_`, so `garden pi` and `garden_pi` shared a node and each one's
/// clean-up deleted the other's entities. The upgrade: `garden pi` moves to a
/// node of its own (a hash of its name), deletes its own documents under the
/// old node (those that name its topics) and leaves `garden_pi`'s.
#[tokio::test]
async fn an_upgrade_moves_a_name_with_a_space_to_its_own_node_and_leaves_the_other_board_s() {
    let broker = Mosquitto::start().await;
    let s = Setup::with_broker(broker, "discovery = true").await;
    std::fs::write(
        &s.home.config,
        std::fs::read_to_string(&s.home.config).unwrap().replace("device = \"testpi\"", "device = \"garden pi\""),
    )
    .unwrap();
    let w = Watcher::start(s.broker.port, &["homeassistant/#", "bramble/garden pi/status"]).await;
    // What an earlier version published for `garden pi`, and what `garden_pi` publishes, on one node.
    let ours_old = "homeassistant/binary_sensor/bramble_garden_pi/status/config";
    w.publish_retained(ours_old, r#"{"name":"Status","state_topic":"bramble/garden pi/status"}"#).await;
    let theirs = "homeassistant/button/bramble_garden_pi/run_x/config";
    w.publish_retained(theirs, r#"{"name":"Run x","command_topic":"bramble/garden_pi/run/x"}"#).await;
    assert!(w.wait_for(10, theirs, |p| !p.is_empty()).await);
    let daemon = s.start();
    assert!(w.wait_last(15, "bramble/garden pi/status", "online").await, "{}", s.log());
    assert!(w.wait_last(15, ours_old, "").await, "our old document is deleted: {}", s.log());
    let new = w.all().into_iter().find(|m| {
        m.topic.starts_with("homeassistant/binary_sensor/bramble_garden_pi_") && m.topic.ends_with("/status/config")
    });
    let new = new.expect("the status sensor under the new node");
    let doc: Value = serde_json::from_str(&new.payload).unwrap();
    let node = new.topic.split('/').nth(2).unwrap().to_string();
    assert_eq!(doc["unique_id"], format!("{node}_status"));
    assert_eq!(doc["device"]["identifiers"][0], node);
    daemon.stop().await;
    assert_eq!(w.last(theirs).as_deref(), Some(r#"{"name":"Run x","command_topic":"bramble/garden_pi/run/x"}"#));
}
