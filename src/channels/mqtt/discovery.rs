//! Home Assistant MQTT discovery (`[mqtt] discovery = true`).
//!
//! One device per bramble (identifiers from the device name, sw_version; in a
//! fleet the device is the board, and a node's says `via_device` its primary), with:
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
    let mut device = json!({
        "identifiers": [node_id(s)],
        "name": format!("bramble {}", s.device),
        "manufacturer": "bramble",
        "model": "bramble agent",
        "sw_version": env!("CARGO_PKG_VERSION"),
    });
    // A fleet node is its own device, shown as reached through its primary.
    if let Some(via) = &s.via {
        device["via_device"] = json!(via);
    }
    device
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
        // Only a document about our own topics is ours to delete: another
        // board whose name once mapped to the same node (`garden pi` and
        // `garden_pi` before the node ids were told apart) keeps its entities.
        _ if !names_our_topics(&link.settings, payload) => {
            tracing::info!(
                topic,
                "Home Assistant discovery: leaving a document under our node that names no topic of ours"
            );
        }
        _ => {
            tracing::info!(topic, "Home Assistant discovery: deleting a document for something that is gone");
            link.set_retained(topic, Vec::new());
        }
    }
}

/// Whether a discovery document (JSON) has a string value under our topic prefix.
fn names_our_topics(s: &Settings, payload: &[u8]) -> bool {
    fn walk(v: &Value, prefix: &str) -> bool {
        match v {
            Value::String(t) => t.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/')),
            Value::Array(a) => a.iter().any(|v| walk(v, prefix)),
            Value::Object(o) => o.values().any(|v| walk(v, prefix)),
            _ => false,
        }
    }
    serde_json::from_slice::<Value>(payload).is_ok_and(|v| walk(&v, &s.prefix))
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
        let node = s.node_id();
        assert!(node.starts_with("bramble_kitchen_pi_") && node.len() == "bramble_kitchen_pi_".len() + 8, "{node}");
        assert_eq!(*topic, format!("homeassistant/button/{node}/run_backup/config"));
        assert_eq!(button["command_topic"], "bramble/kitchen pi/run/backup");
        assert_eq!(button["device"]["identifiers"][0], node);
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

    /// A device name with `+` or `#` needs a topic prefix of its own (the default one is refused).
    fn settings_of(device: &str) -> Settings {
        let toml =
            format!("[mqtt]\nurl = \"mqtt://127.0.0.1\"\ndevice = {}\ntopic_prefix = \"home/pi\"\n", toml_str(device));
        let cfg = crate::config::Config::parse(&toml, "c.toml".as_ref()).unwrap();
        Settings::from_config(&cfg.mqtt).unwrap().unwrap()
    }

    fn toml_str(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    #[test]
    fn node_ids_never_collide_and_plain_names_keep_theirs() {
        // Plain names: what earlier versions published, so HA keeps the entities.
        assert_eq!(settings_of("garden_pi").node_id(), "bramble_garden_pi");
        assert_eq!(settings_of("kitchen-2").node_id(), "bramble_kitchen-2");
        let hostile = [
            "garden pi",
            "garden_pi",
            "garden/pi",
            "garden#pi",
            "garden+pi",
            "gärden pi",
            "garden pi ",
            "🍓 pi",
            "🍒 pi",
            &"x".repeat(300),
            &format!("{} a", "x".repeat(300)),
            &format!("{} b", "x".repeat(300)),
        ];
        let mut seen = std::collections::BTreeMap::new();
        for name in hostile {
            let s = settings_of(name);
            let node = s.node_id();
            assert!(node.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{name:?}: {node}");
            assert!(
                node.len() <= "bramble_".len() + 48 + 9 || name.chars().all(|c| c.is_ascii_alphanumeric()),
                "{node}"
            );
            assert!(crate::util::mqtt::check_topic(&s.discovery_filter().replace('+', "x")).is_ok(), "{node}");
            assert_eq!(node, settings_of(name).node_id(), "stable");
            if let Some(other) = seen.insert(s.device.clone(), node.clone()) {
                assert_eq!(other, node, "the same (trimmed) name");
            }
        }
        let nodes: std::collections::BTreeSet<&String> = seen.values().collect();
        assert_eq!(nodes.len(), seen.len(), "one node per name: {seen:#?}");
    }

    #[test]
    fn clean_up_deletes_only_documents_about_our_own_topics() {
        let mut s = settings_of("garden_pi");
        s.prefix = "bramble/garden_pi".into();
        // Ours (an old button of this board): its topics are under our prefix.
        let ours = json!({"command_topic": "bramble/garden_pi/run/x", "availability": [{"topic": "bramble/garden_pi/status"}]});
        assert!(names_our_topics(&s, ours.to_string().as_bytes()));
        // `garden pi` before the upgrade published under the same node: not ours.
        let theirs = json!({"state_topic": "bramble/garden pi/status", "unique_id": "bramble_garden_pi_status"});
        assert!(!names_our_topics(&s, theirs.to_string().as_bytes()));
        let longer = json!({"state_topic": "bramble/garden_pi2/status"});
        assert!(!names_our_topics(&s, longer.to_string().as_bytes()), "a prefix of another board's prefix");
        assert!(!names_our_topics(&s, b"not json"));
    }
}
