//! `mqtt_publish`: the agent publishes to an MQTT topic (a light, a display,
//! a Node-RED flow) — only to topics matching `[mqtt] publish_allow`.
//!
//! Registered only when a broker is configured. It publishes through the
//! [`Publisher`] the composition root gives it (the daemon's MQTT connection)
//! and waits for the broker's acknowledgement, so "published" means the broker
//! has it. Without one (`bramble agent`) or while the broker is unreachable it
//! says so instead of pretending.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, Tool, ToolContext, ToolError};
use crate::delivery::Publisher;
use crate::util::mqtt::{topic_matches, InputTopics};
use crate::util::BoxFuture;

pub struct MqttPublish {
    allow: Vec<String>,
    publisher: Option<Arc<dyn Publisher>>,
    /// The topics bramble listens to: never published to, whatever `allow` says.
    inputs: Option<InputTopics>,
}

impl MqttPublish {
    /// `publisher`: the daemon's MQTT connection; `None` where there is none.
    pub fn new(allow: Vec<String>, publisher: Option<Arc<dyn Publisher>>) -> MqttPublish {
        MqttPublish { allow, publisher, inputs: None }
    }

    /// Refuse bramble's own input topics (`<prefix>/in`, `<prefix>/run/+`,
    /// triggers, discovery) before anything is sent, with a clear error.
    pub fn refusing(mut self, inputs: Option<InputTopics>) -> MqttPublish {
        self.inputs = inputs;
        self
    }

    /// Ok if the topic may be published to; otherwise the reason, for the model.
    pub fn check(&self, topic: &str) -> Result<(), ToolError> {
        let valid = match &self.inputs {
            Some(inputs) => inputs.refuse(topic),
            None => crate::util::mqtt::check_topic(topic),
        };
        if let Err(e) = valid {
            return Err(ToolError::new(format!("`{}` is not a topic to publish to: {e}", topic.escape_debug())));
        }
        if self.allow.is_empty() {
            return Err(ToolError::new(
                "publishing is not allowed to any topic: the user has to list patterns in [mqtt] publish_allow",
            ));
        }
        if !self.allow.iter().any(|f| topic_matches(f, topic)) {
            return Err(ToolError::new(format!(
                "publishing to `{topic}` is not allowed; allowed patterns ([mqtt] publish_allow): {}",
                self.allow.join(", ")
            )));
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct Args {
    topic: String,
    payload: Value,
    #[serde(default)]
    retain: bool,
}

impl Tool for MqttPublish {
    fn name(&self) -> &str {
        "mqtt_publish"
    }

    fn description(&self) -> &str {
        "Publish a message to an MQTT topic (home automation: lights, displays, flows). Only topics allowed by \
         the user's [mqtt] publish_allow patterns work. `payload` is sent as text; a JSON object is sent as JSON."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "topic": {"type": "string", "description": "The topic, without wildcards."},
                "payload": {"description": "Text, or a JSON value sent as JSON."},
                "retain": {"type": "boolean", "description": "Ask the broker to keep it as the topic's last value (default false)."}
            },
            "required": ["topic", "payload"]
        })
    }

    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(self.name(), args)?;
            let topic = args.topic.trim();
            self.check(topic)?;
            let payload = match args.payload {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let Some(publisher) = &self.publisher else {
                return Err(ToolError::new(
                    "MQTT is not running in this process (it runs in the daemon, `bramble run`)",
                ));
            };
            let n = payload.len();
            publisher
                .publish(topic, payload.into_bytes(), args.retain)
                .await
                .map_err(|e| ToolError::new(format!("not published to `{topic}`: {e}")))?;
            Ok(format!("Published {n} bytes to `{topic}`{}.", if args.retain { " (retained)" } else { "" }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_topics() {
        let t = MqttPublish::new(vec!["home/lights/+/set".into(), "display/#".into()], None);
        assert!(t.check("home/lights/kitchen/set").is_ok());
        assert!(t.check("display/a/b").is_ok());
        assert!(t.check("home/locks/front/set").unwrap_err().0.contains("not allowed"));
        assert!(t.check("home/lights/+/set").unwrap_err().0.contains("wildcards"));
        assert!(MqttPublish::new(vec![], None).check("a").unwrap_err().0.contains("publish_allow"));
        for bad in ["a/\0", "$SYS/x", ""] {
            assert!(t.check(bad).unwrap_err().0.contains("not a topic to publish to"), "{bad:?}");
        }
    }

    #[test]
    fn never_to_bramble_s_own_inputs_even_when_allowed() {
        let inputs = InputTopics { prefix: "bramble/pi".into(), inbound: true, ..Default::default() };
        let t = MqttPublish::new(vec!["#".into()], None).refusing(Some(inputs));
        assert!(t.check("home/x").is_ok());
        for own in ["bramble/pi/in", "bramble/pi/run/backup"] {
            assert!(t.check(own).unwrap_err().0.contains("own input topics"), "{own}");
        }
    }
}
