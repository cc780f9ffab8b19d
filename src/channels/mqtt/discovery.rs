//! Home Assistant MQTT discovery (`[mqtt] discovery = true`).
//!
//! One device per bramble (identifiers from the device name, sw_version), with:
//! a connectivity `binary_sensor` on `<prefix>/status`, a timestamp `sensor`
//! for the last heartbeat (`<prefix>/heartbeat/last`), a `sensor` for the last
//! job run (`<prefix>/last_job`, JSON), and one `button` per job whose command
//! topic is `<prefix>/run/<job>`. Documents are retained
//! `homeassistant/<component>/<node>/<object>/config` messages in the
//! single-component format with full key names.
//!
//! Documents are part of the [`Link`]'s retained state, so they are published
//! again on every ConnAck; they are recomputed when `jobs.json` changes. A
//! removed job's button is deleted with an empty retained payload. A job
//! removed while the daemon was down is found on the broker: we subscribe to
//! our own discovery topics and clear any config we no longer publish.

use serde_json::{json, Value};

use super::{Link, Settings};
use crate::scheduler::Job;

/// Home Assistant's default discovery prefix.
pub const DISCOVERY_PREFIX: &str = "homeassistant";

/// The device name as a discovery node id: `[a-zA-Z0-9_-]` only.
pub fn node_id(s: &Settings) -> String {
    let clean: String =
        s.device.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("bramble_{clean}")
}

/// The filter matching every discovery document of this device.
pub fn cleanup_filter(s: &Settings) -> String {
    format!("{DISCOVERY_PREFIX}/+/{}/+/config", node_id(s))
}

/// Whether `topic` is one of this device's discovery documents.
pub fn is_own_config(s: &Settings, topic: &str) -> bool {
    crate::util::mqtt::topic_matches(&cleanup_filter(s), topic)
}

fn config_topic(s: &Settings, component: &str, object: &str) -> String {
    format!("{DISCOVERY_PREFIX}/{component}/{}/{object}/config", node_id(s))
}

fn device(s: &Settings) -> Value {
    json!({
        "identifiers": [node_id(s)],
        "name": format!("bramble {}", s.device),
        "manufacturer": "bramble",
        "model": "bramble agent",
        "sw_version": env!("CARGO_PKG_VERSION"),
    })
}

/// Every discovery document for these jobs: `(topic, payload)`.
pub fn documents(s: &Settings, jobs: &[Job]) -> Vec<(String, Value)> {
    let node = node_id(s);
    let status = s.topic("status");
    let available = json!([{ "topic": status, "payload_available": "online", "payload_not_available": "offline" }]);
    let mut docs = vec![
        (
            config_topic(s, "binary_sensor", "status"),
            json!({
                "name": "Status",
                "unique_id": format!("{node}_status"),
                "device_class": "connectivity",
                "entity_category": "diagnostic",
                "state_topic": status,
                "payload_on": "online",
                "payload_off": "offline",
                "device": device(s),
            }),
        ),
        (
            config_topic(s, "sensor", "last_heartbeat"),
            json!({
                "name": "Last heartbeat",
                "unique_id": format!("{node}_last_heartbeat"),
                "device_class": "timestamp",
                "state_topic": s.topic("heartbeat/last"),
                "availability": available,
                "device": device(s),
            }),
        ),
        (
            config_topic(s, "sensor", "last_job"),
            json!({
                "name": "Last job",
                "unique_id": format!("{node}_last_job"),
                "state_topic": s.topic("last_job"),
                "value_template": "{{ value_json.job }}: {{ value_json.status }}",
                "json_attributes_topic": s.topic("last_job"),
                "availability": available,
                "device": device(s),
            }),
        ),
    ];
    for job in jobs {
        docs.push((
            config_topic(s, "button", &format!("run_{}", job.name)),
            json!({
                "name": format!("Run {}", job.name),
                "unique_id": format!("{node}_run_{}", job.name),
                "command_topic": s.topic(&format!("run/{}", job.name)),
                "payload_press": "PRESS",
                "availability": available,
                "device": device(s),
            }),
        ));
    }
    docs
}

/// Publish the documents for `jobs`; delete the buttons of jobs in `before`
/// that are gone.
pub fn publish(link: &Link, jobs: &[Job], before: &[String]) {
    let s = &link.settings;
    for (topic, doc) in documents(s, jobs) {
        link.set_retained(&topic, doc.to_string().into_bytes());
    }
    for gone in before.iter().filter(|n| !jobs.iter().any(|j| &j.name == *n)) {
        tracing::info!(job = %gone, "Home Assistant discovery: removing the job's button");
        link.set_retained(&config_topic(s, "button", &format!("run_{gone}")), Vec::new());
    }
}

/// A retained discovery document of ours arrived from the broker: if we no
/// longer publish it (a job removed while the daemon was down), delete it.
pub fn check_leftover(link: &Link, topic: &str, payload: &[u8]) {
    if payload.is_empty() {
        return;
    }
    match link.retained_value(topic) {
        Some(ours) if !ours.is_empty() => {}
        _ => {
            tracing::info!(topic, "Home Assistant discovery: deleting a document for something that is gone");
            link.set_retained(topic, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_name_the_device_and_one_button_per_job() {
        let cfg = crate::config::Config::parse(
            "[mqtt]\nurl = \"mqtt://127.0.0.1\"\ndevice = \"kitchen pi\"\n",
            "c.toml".as_ref(),
        )
        .unwrap();
        let s = Settings::from_config(&cfg.mqtt).unwrap().unwrap();
        let now = jiff::Timestamp::now();
        let job = Job::new(
            "backup",
            crate::scheduler::Schedule::Every { every: crate::scheduler::parse_every("1h").unwrap(), anchor: now },
            crate::scheduler::JobKind::Remind { text: "x".into() },
            vec![],
            now,
            &jiff::tz::TimeZone::UTC,
        )
        .unwrap();
        let docs = documents(&s, &[job]);
        assert_eq!(docs.len(), 4);
        let (topic, button) = &docs[3];
        assert_eq!(topic, "homeassistant/button/bramble_kitchen_pi/run_backup/config");
        assert_eq!(button["command_topic"], "bramble/kitchen pi/run/backup");
        assert_eq!(button["device"]["identifiers"][0], "bramble_kitchen_pi");
        assert!(is_own_config(&s, topic));
        assert_eq!(docs[0].1["device_class"], "connectivity");
        assert_eq!(docs[1].1["device_class"], "timestamp");
    }
}
