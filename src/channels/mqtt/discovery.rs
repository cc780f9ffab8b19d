//! Home Assistant MQTT discovery (`[mqtt] discovery = true`).
//!
//! One device per bramble (identifiers from the device name, sw_version), with:
//! a connectivity `binary_sensor` on `<prefix>/status`, a `problem`
//! `binary_sensor` on `<prefix>/problem` (on while an alert is open, the
//! alerts as its attribute: [`crate::work::alerts`]), a timestamp `sensor`
//! for the last heartbeat (`<prefix>/heartbeat/last`), a `sensor` for the last
//! job run (`<prefix>/last_job`, JSON), and a `button` for each job marked for
//! it (`cron add --ha-button`, the cron tool's `ha_button`) whose command
//! topic is `<prefix>/run/<job>`. Documents are retained
//! `homeassistant/<component>/<node>/<object>/config` messages in the
//! single-component format with full key names.
//!
//! Buttons are opt-in and capped at [`MAX_BUTTONS`]: a button per job made
//! memory (every document stays in the link's retained set), the broker's
//! retained store and Home Assistant's entity list grow with the number of
//! jobs — 10,000 jobs took the daemon from 18 to 43 MB. Any job can still be
//! run by publishing to `<prefix>/run/<job>`.
//!
//! Documents are part of the [`Link`]'s retained state, so they are published
//! again on every ConnAck; they are recomputed when `jobs.json` changes. A
//! button no longer published (job removed, unmarked, over the cap) is
//! deleted with an empty retained payload. One removed while the daemon was
//! down (or left by an earlier version, which had a button per job) is found
//! on the broker: we subscribe to our own discovery topics and clear any
//! config we no longer publish.

use serde_json::{json, Value};

use super::{Link, Settings};
use crate::scheduler::Job;

pub use crate::clients::mqtt::DISCOVERY_PREFIX;

/// At most this many job buttons are published (the first marked jobs in the
/// store's order); more marked jobs are logged once.
pub const MAX_BUTTONS: usize = 50;

/// The discovery object id of a job's button.
pub fn button_object(job: &str) -> String {
    format!("run_{job}")
}

/// The jobs that get a button: marked ones, at most [`MAX_BUTTONS`]. The
/// second value is how many marked jobs were left out.
pub fn button_jobs(jobs: &[Job]) -> (Vec<&Job>, usize) {
    let marked: Vec<&Job> = jobs.iter().filter(|j| j.ha_button).collect();
    let over = marked.len().saturating_sub(MAX_BUTTONS);
    (marked.into_iter().take(MAX_BUTTONS).collect(), over)
}

/// The device's discovery node id ([`Settings::node_id`]).
pub fn node_id(s: &Settings) -> String {
    s.node_id()
}

/// The filter matching every discovery document of this device.
pub fn cleanup_filter(s: &Settings) -> String {
    s.discovery_filter()
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

/// Every discovery document: the device's, and a button for each of `buttons`.
pub fn documents(s: &Settings, buttons: &[&Job]) -> Vec<(String, Value)> {
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
            config_topic(s, "binary_sensor", "problem"),
            json!({
                "name": "Problem",
                "unique_id": format!("{node}_problem"),
                "device_class": "problem",
                "entity_category": "diagnostic",
                "state_topic": s.topic("problem"),
                "value_template": "{{ value_json.state }}",
                "json_attributes_topic": s.topic("problem"),
                "json_attributes_template": "{{ {'problems': value_json.problems} | tojson }}",
                "payload_on": "ON",
                "payload_off": "OFF",
                "availability": available,
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
    for job in buttons {
        docs.push((
            config_topic(s, "button", &button_object(&job.name)),
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

/// Publish the documents for `jobs` and delete the buttons in `before` (the
/// names published last time) that are no longer published. Returns the
/// names with a button now. `warned` says whether the cap was logged already.
pub fn publish(link: &Link, jobs: &[Job], before: &[String], warned: &mut bool) -> Vec<String> {
    let s = &link.settings;
    // A button publishes to `<prefix>/run/<job>`: none while inbound is off (old ones are cleared).
    let (buttons, over) = if s.inbound { button_jobs(jobs) } else { (Vec::new(), 0) };
    if over > 0 && !std::mem::replace(warned, true) {
        tracing::warn!(
            "Home Assistant discovery: {} jobs are marked for a button; only the first {MAX_BUTTONS} get one \
             (the others still run from <prefix>/run/<job>)",
            MAX_BUTTONS + over
        );
    }
    for (topic, doc) in documents(s, &buttons) {
        link.set_retained(&topic, doc.to_string().into_bytes());
    }
    let now: Vec<String> = buttons.iter().map(|j| j.name.clone()).collect();
    for gone in before.iter().filter(|n| !now.contains(n)) {
        tracing::info!(job = %gone, "Home Assistant discovery: removing the job's button");
        link.set_retained(&config_topic(s, "button", &button_object(gone)), Vec::new());
    }
    now
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

    fn job(name: &str, ha_button: bool) -> Job {
        let now = jiff::Timestamp::now();
        let mut job = Job::new(
            name,
            crate::scheduler::Schedule::Every { every: crate::scheduler::parse_every("1h").unwrap(), anchor: now },
            crate::scheduler::JobKind::Remind { text: "x".into() },
            vec![],
            now,
            &jiff::tz::TimeZone::UTC,
        )
        .unwrap();
        job.ha_button = ha_button;
        job
    }

    #[test]
    fn documents_name_the_device_and_a_button_per_marked_job() {
        let cfg = crate::config::Config::parse(
            "[mqtt]\nurl = \"mqtt://127.0.0.1\"\ndevice = \"kitchen pi\"\n",
            "c.toml".as_ref(),
        )
        .unwrap();
        let s = Settings::from_config(&cfg.mqtt).unwrap().unwrap();
        let jobs = [job("backup", true), job("tea", false)];
        let (buttons, over) = button_jobs(&jobs);
        assert_eq!((buttons.len(), over), (1, 0));
        let docs = documents(&s, &buttons);
        assert_eq!(docs.len(), 5);
        let (topic, button) = &docs[4];
        assert_eq!(topic, "homeassistant/button/bramble_kitchen_pi/run_backup/config");
        assert_eq!(button["command_topic"], "bramble/kitchen pi/run/backup");
        assert_eq!(button["device"]["identifiers"][0], "bramble_kitchen_pi");
        assert!(is_own_config(&s, topic));
        assert_eq!(docs[0].1["device_class"], "connectivity");
        assert_eq!(docs[1].1["device_class"], "problem");
        assert_eq!(docs[1].1["state_topic"], "bramble/kitchen pi/problem");
        assert_eq!(docs[2].1["device_class"], "timestamp");
    }

    #[test]
    fn buttons_are_capped_in_store_order() {
        let jobs: Vec<Job> = (0..MAX_BUTTONS + 7).map(|i| job(&format!("j{i}"), i != 3)).collect();
        let (buttons, over) = button_jobs(&jobs);
        assert_eq!(buttons.len(), MAX_BUTTONS);
        assert_eq!(over, 6, "{} marked", MAX_BUTTONS + 6);
        assert_eq!(buttons[3].name, "j4", "unmarked jobs are skipped");
        assert_eq!(buttons.last().unwrap().name, format!("j{}", MAX_BUTTONS));
    }

    #[test]
    fn the_mark_is_kept_in_the_file_only_when_set() {
        let plain = serde_json::to_value(job("a", false)).unwrap();
        assert!(plain.get("ha_button").is_none(), "files of jobs without it stay as before");
        let marked = serde_json::to_value(job("b", true)).unwrap();
        assert_eq!(marked["ha_button"], true);
        let back: Job = serde_json::from_value(marked).unwrap();
        assert!(back.ha_button);
    }
}
