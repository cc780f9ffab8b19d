//! MQTT topics: filter matching (shared by the channel's triggers and
//! discovery clean-up and the `mqtt_publish` tool's allow-list), the rules a
//! topic bramble publishes to must follow, and [`InputTopics`], the topics
//! bramble itself listens to — which it therefore never publishes to.
//!
//! Why the rules: a topic a broker refuses is not refused with an error but by
//! closing the connection (MQTT 3.1.1 §1.5.3, §4.7; MQTT 5 §1.5.4, §4.7). A
//! report queued for one would be retried after every reconnect and stall the
//! channel, so a topic is checked where it is accepted, long before a publish.
//!
//! Why the inputs: a report published to a topic bramble subscribes to comes
//! back as a new message — an answer to `<prefix>/in` that is sent to
//! `<prefix>/in` starts the next turn, and so on, thousands of model calls a
//! minute; a report to `<prefix>/run/<job>` runs the job.

/// Whether `topic` matches the MQTT filter `filter` (`+` one level, `#` the rest).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The longest topic MQTT can carry (a two-byte length).
pub const MAX_TOPIC_BYTES: usize = 65535;

/// Why a topic cannot be published to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("an MQTT topic cannot be empty")]
    Empty,
    #[error("an MQTT topic is at most {MAX_TOPIC_BYTES} bytes (this one has {0})")]
    TooLong(usize),
    #[error("a topic to publish to cannot contain the wildcards `+` or `#`")]
    Wildcard,
    #[error("a topic cannot contain U+{0:04X} (a NUL, control or non-character: brokers close the connection on it)")]
    Character(u32),
    #[error("topics starting with `$` are the broker's own (`$SYS/…`); clients do not publish there")]
    Dollar,
    #[error(
        "`{topic}` is one of bramble's own input topics ({what}): a report there would come back as a new {came_back}"
    )]
    OwnInput { topic: String, what: &'static str, came_back: &'static str },
}

/// Check a topic to publish to against MQTT's rules: not empty, at most
/// [`MAX_TOPIC_BYTES`], no wildcards, not a `$` topic, and no character a
/// broker may close the connection on (U+0000, which MQTT forbids; the
/// control characters U+0001–U+001F and U+007F–U+009F and the Unicode
/// non-characters, which it says SHOULD NOT be sent and a receiver MAY
/// disconnect for — mosquitto does). Rust strings are always valid UTF-8.
pub fn check_topic(topic: &str) -> Result<(), TopicError> {
    if topic.is_empty() {
        return Err(TopicError::Empty);
    }
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(TopicError::TooLong(topic.len()));
    }
    if let Some(c) = topic.chars().find(|&c| refused_char(c)) {
        return Err(TopicError::Character(c as u32));
    }
    if topic.contains(['+', '#']) {
        return Err(TopicError::Wildcard);
    }
    if topic.starts_with('$') {
        return Err(TopicError::Dollar);
    }
    Ok(())
}

fn refused_char(c: char) -> bool {
    let n = c as u32;
    n <= 0x1F || (0x7F..=0x9F).contains(&n) || (0xFDD0..=0xFDEF).contains(&n) || (n & 0xFFFE) == 0xFFFE
}

/// What a message on one of bramble's input topics does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input<'a> {
    /// `<prefix>/in`: an agent turn.
    Agent,
    /// `<prefix>/run/<job>`: runs a job (Home Assistant's buttons publish here).
    Run(&'a str),
    /// One of this device's Home Assistant discovery documents (clean-up).
    Discovery,
    /// A `[[mqtt.trigger]]` topic.
    Trigger,
    /// The fleet's topics (other boards' presence, commands, reports: `crate::fleet`).
    Fleet,
}

/// The topics bramble subscribes to and what a message on each does: the one
/// list the connection subscribes to ([`subscriptions`](Self::subscriptions)),
/// routes by ([`classify`](Self::classify)) and refuses to publish to
/// ([`refuse`](Self::refuse)), so the three cannot drift apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputTopics {
    /// `<prefix>`, without a trailing `/`.
    pub prefix: String,
    /// `<prefix>/in` and `<prefix>/run/+` are listened to.
    pub inbound: bool,
    /// The discovery documents' filters (`homeassistant/+/<node>/+/config`, and the
    /// node an earlier version used if it differs), when discovery is on.
    pub discovery: Vec<String>,
    /// The `[[mqtt.trigger]]` filters.
    pub triggers: Vec<String>,
    /// The fleet's filters (`[fleet]`; empty without one).
    pub fleet: Vec<String>,
}

impl InputTopics {
    /// The filters to subscribe to.
    pub fn subscriptions(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.inbound {
            v.extend([format!("{}/in", self.prefix), format!("{}/run/+", self.prefix)]);
        }
        let mut triggers = self.triggers.clone();
        triggers.sort();
        triggers.dedup();
        v.extend(triggers);
        v.extend(self.discovery.iter().cloned());
        v.extend(self.fleet.iter().cloned());
        v
    }

    /// What a message on `topic` does, if anything. Bramble's own topics
    /// (`<prefix>/…`) other than `in` and `run/<job>` never trigger: a trigger
    /// on `#` would otherwise answer its own reports.
    pub fn classify<'a>(&self, topic: &'a str) -> Option<Input<'a>> {
        let own = topic.strip_prefix(self.prefix.as_str()).and_then(|r| r.strip_prefix('/'));
        if self.inbound {
            match own {
                Some("in") => return Some(Input::Agent),
                Some(rest) => {
                    if let Some(job) = rest.strip_prefix("run/") {
                        return Some(Input::Run(job));
                    }
                }
                None => {}
            }
        }
        if self.discovery.iter().any(|f| topic_matches(f, topic)) {
            return Some(Input::Discovery);
        }
        if self.fleet.iter().any(|f| topic_matches(f, topic)) {
            return Some(Input::Fleet);
        }
        if own.is_none() && self.triggers.iter().any(|f| topic_matches(f, topic)) {
            return Some(Input::Trigger);
        }
        None
    }

    /// A topic bramble may publish a report to: MQTT's rules ([`check_topic`])
    /// and none of its own input topics.
    pub fn refuse(&self, topic: &str) -> Result<(), TopicError> {
        check_topic(topic)?;
        let (what, came_back) = match self.classify(topic) {
            None => return Ok(()),
            Some(Input::Agent) => ("it starts an agent turn", "message"),
            Some(Input::Run(_)) => ("it runs a job", "job run"),
            Some(Input::Discovery) => ("a Home Assistant discovery document", "discovery document"),
            Some(Input::Trigger) => ("it fires a [[mqtt.trigger]]", "trigger run"),
            Some(Input::Fleet) => ("a fleet topic", "fleet message"),
        };
        Err(TopicError::OwnInput { topic: topic.to_string(), what, came_back })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_mqtt_says() {
        assert!(topic_matches("a/b", "a/b"));
        assert!(!topic_matches("a/b", "a/b/c"));
        assert!(topic_matches("a/+/c", "a/x/c"));
        assert!(!topic_matches("a/+/c", "a/x/y"));
        assert!(topic_matches("a/#", "a/x/y"));
        assert!(topic_matches("a/#", "a"));
        assert!(topic_matches("#", "anything/at/all"));
        assert!(!topic_matches("a/+", "b/x"));
    }

    #[test]
    fn topics_follow_the_mqtt_rules() {
        assert!(check_topic("home/kitchen/say").is_ok());
        assert!(check_topic("ü/日本/x y").is_ok());
        assert_eq!(check_topic(""), Err(TopicError::Empty));
        assert_eq!(check_topic("a\0b"), Err(TopicError::Character(0)));
        assert_eq!(check_topic("a\u{1}b"), Err(TopicError::Character(1)));
        assert_eq!(check_topic("a\u{85}b"), Err(TopicError::Character(0x85)));
        assert_eq!(check_topic("a\u{FFFF}"), Err(TopicError::Character(0xFFFF)));
        assert_eq!(check_topic("a\u{1FFFE}"), Err(TopicError::Character(0x1FFFE)));
        assert_eq!(check_topic("a\u{FDD0}"), Err(TopicError::Character(0xFDD0)));
        assert_eq!(check_topic("a/+/b"), Err(TopicError::Wildcard));
        assert_eq!(check_topic("a/#"), Err(TopicError::Wildcard));
        assert_eq!(check_topic("$SYS/broker/x"), Err(TopicError::Dollar));
        assert_eq!(check_topic(&"a".repeat(65536)), Err(TopicError::TooLong(65536)));
        assert!(check_topic(&"a".repeat(65535)).is_ok());
    }

    fn inputs() -> InputTopics {
        InputTopics {
            prefix: "bramble/pi".into(),
            inbound: true,
            discovery: vec!["homeassistant/+/bramble_pi/+/config".into()],
            triggers: vec!["zigbee/+/door".into(), "#".into()],
            fleet: vec!["bramble/+/fleet/board".into()],
        }
    }

    #[test]
    fn own_inputs_are_classified_like_the_router_and_refused() {
        let i = inputs();
        assert_eq!(i.classify("bramble/pi/in"), Some(Input::Agent));
        assert_eq!(i.classify("bramble/pi/run/backup"), Some(Input::Run("backup")));
        assert_eq!(i.classify("homeassistant/button/bramble_pi/run_x/config"), Some(Input::Discovery));
        assert_eq!(i.classify("zigbee/front/door"), Some(Input::Trigger));
        // Own topics never trigger, so `#` does not make them inputs.
        assert_eq!(i.classify("bramble/pi/out"), None);
        assert_eq!(i.classify("bramble/pi/inbox"), None);
        for t in ["bramble/pi/in", "bramble/pi/run/x", "zigbee/a/door", "anything"] {
            let e = i.refuse(t).unwrap_err();
            assert!(e.to_string().contains("own input topics"), "{e}");
        }
        assert!(i.refuse("bramble/pi/out").is_ok());
        assert!(i.refuse("bramble/pi/\0").is_err());
        let quiet = InputTopics { inbound: false, discovery: vec![], triggers: vec![], ..inputs() };
        assert!(quiet.refuse("bramble/pi/in").is_ok(), "not listened to: not an input");
        assert_eq!(
            i.subscriptions(),
            [
                "bramble/pi/in",
                "bramble/pi/run/+",
                "#",
                "zigbee/+/door",
                "homeassistant/+/bramble_pi/+/config",
                "bramble/+/fleet/board"
            ]
        );
        // The fleet's topics go to the fleet, and no report is published there.
        assert_eq!(i.classify("bramble/garage/fleet/board"), Some(Input::Fleet));
        assert!(i.refuse("bramble/garage/fleet/board").is_err());
    }
}
