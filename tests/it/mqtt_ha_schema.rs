//! Every Home Assistant discovery document bramble publishes, checked with
//! Home Assistant's own schemas (the `homeassistant` package from PyPI,
//! pinned in `tests/fixtures/homeassistant/`; its MQTT platforms'
//! `DISCOVERY_SCHEMA`, after HA's abbreviation expansion): a document HA
//! would refuse fails the test. A deliberately broken document is checked
//! too, so the check is known to refuse.

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::{bramble, TestHome};

/// Run HA's schemas over `docs` ([topic, payload] pairs): (passed, output).
async fn check(docs: &[(String, String)]) -> (bool, String) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/homeassistant");
    let req = dir.join("requirements.txt");
    let python =
        tokio::task::spawn_blocking(move || crate::support::python::venv("homeassistant", &req)).await.expect("venv");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_string(docs).unwrap()).unwrap();
    let out = tokio::process::Command::new(python)
        .arg(dir.join("check_discovery.py"))
        .arg(file.path())
        .output()
        .await
        .expect("python");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test]
async fn every_discovery_document_passes_home_assistant_s_own_schemas() {
    let broker = Mosquitto::start().await;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    // A name with a space and a `/`: the node id gets its hash (src/clients/mqtt, `node_id`).
    let extra = format!(
        "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n[mqtt]\nurl = \"{}\"\ndevice = \"garden pi/2\"\n\
         topic_prefix = \"bramble/garden\"\ndiscovery = true\n",
        broker.url()
    );
    let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
    let config = home.config.to_string_lossy().into_owned();
    let add = ["--config", &config, "cron", "add", "ping", "--every", "1h", "--exec", "echo ran", "--ha-button"];
    let out = bramble(home.path(), &add, None).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let w = Watcher::start(broker.port, &["homeassistant/#", "bramble/garden/status"]).await;
    let log = home.path().join("daemon.log");
    let daemon = Daemon::start_logging_to(home.path(), Some(&home.config), &log);
    let docs =
        || w.all().into_iter().filter(|m| m.topic.starts_with("homeassistant/") && !m.payload.is_empty()).count();
    // Status, problem, last heartbeat, last job, and the button.
    assert!(
        wait_until(20, || docs() >= 5).await,
        "{:?}\n{}",
        w.all(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    daemon.stop().await;
    let mut seen: Vec<(String, String)> = Vec::new();
    for m in w.all().into_iter().filter(|m| m.topic.starts_with("homeassistant/") && !m.payload.is_empty()) {
        if !seen.iter().any(|(t, _)| *t == m.topic) {
            seen.push((m.topic, m.payload));
        }
    }
    assert!(seen.iter().any(|(t, _)| t.starts_with("homeassistant/button/bramble_garden_pi_2_")), "{seen:?}");
    let (ok, text) = check(&seen).await;
    assert!(ok, "Home Assistant refuses a discovery document:\n{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("ok ")).count(), seen.len(), "{text}");

    // The control: a button without its command topic, a sensor with an unknown device class.
    let broken = vec![
        ("homeassistant/button/x/y/config".to_string(), r#"{"name":"x","unique_id":"x"}"#.to_string()),
        ("homeassistant/sensor/x/z/config".to_string(), r#"{"state_topic":"a","device_class":"nope"}"#.to_string()),
    ];
    let (ok, text) = check(&broken).await;
    assert!(!ok && text.matches("REFUSED").count() == 2, "{text}");
}

/// In a fleet each board is its own Home Assistant device, named by its board
/// name (not its host name: every Raspberry Pi OS board is `raspberrypi`),
/// and a node's device says it is reached through its primary's.
#[cfg(feature = "fleet")]
#[tokio::test]
async fn a_fleet_node_is_its_own_device_reached_through_its_primary() {
    let broker = Mosquitto::start().await;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let extra = format!(
        "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n[mqtt]\nurl = \"{}\"\ndiscovery = true\n\
         [fleet]\nname = \"garage\"\nrole = \"node\"\nprimary = \"living\"\nkey_env = \"HA_FLEET_KEY\"\n",
        broker.url()
    );
    let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
    let w = Watcher::start(broker.port, &["homeassistant/#", "bramble/garage/status"]).await;
    let log = home.path().join("daemon.log");
    let key = std::path::Path::new("0123456789abcdef0123456789abcdef");
    let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, &[("HA_FLEET_KEY", key)]);
    let ours = || {
        w.all()
            .into_iter()
            .filter(|m| m.topic.starts_with("homeassistant/") && !m.payload.is_empty())
            .map(|m| (m.topic, m.payload))
            .collect::<Vec<_>>()
    };
    assert!(wait_until(20, || ours().len() >= 4).await, "{:?}\n{}", w.all(), daemon.log());
    assert!(
        wait_until(10, || w.all().iter().any(|m| m.topic == "bramble/garage/status" && m.payload == "online")).await,
        "the board's status is under its board name: {:?}",
        w.all()
    );
    daemon.stop().await;
    let docs = ours();
    for (topic, payload) in &docs {
        assert!(topic.contains("/bramble_garage/"), "the node id is the board's: {topic}");
        let doc: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(doc["device"]["identifiers"][0], "bramble_garage", "{payload}");
        assert_eq!(doc["device"]["name"], "bramble garage", "{payload}");
        assert_eq!(doc["device"]["via_device"], "bramble_living", "reached through the primary: {payload}");
    }
    let (ok, text) = check(&docs).await;
    assert!(ok, "Home Assistant refuses a fleet node's discovery document:\n{text}");
}
