//! `[telegram]` and `[mqtt]` (with `[[mqtt.trigger]]`): the chat and the
//! broker channels' settings. Split from `mod.rs`; re-exported there.

use serde::Deserialize;

use super::{secret_from_env, Dur, HttpUrl, Secret};
use crate::bus::Target;

/// `[telegram]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramConfig {
    pub token: Option<Secret>,
    pub token_env: Option<String>,
    /// User ids or `@usernames` that may talk to the bot. Empty: nobody.
    /// Ids may be written as numbers (`[123456789]`) or strings.
    #[serde(deserialize_with = "ids")]
    pub allow_from: Vec<String>,
    pub api_base: HttpUrl,
    /// A photo is taken in the largest size Telegram made whose longer side is
    /// at most this many pixels.
    pub max_image_px: u32,
    /// Files (documents, audio) larger than this are refused; the Bot API's
    /// own limit for bots is 20 MB.
    pub max_file_mb: u64,
    /// While a chat turn runs tools, one status message says what is happening.
    pub progress: bool,
    /// Which job reports carry Done / Snooze buttons: `reminders` (`remind`
    /// jobs), `all`, `none`.
    pub buttons: ReportButtons,
    /// The time of day of the "Tomorrow" snooze (`HH:MM`, the agent's zone).
    pub tomorrow_at: String,
}

/// `[telegram] buttons`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportButtons {
    #[default]
    Reminders,
    All,
    None,
}

/// A list of ids, each a string or an integer (as users write Telegram ids
/// in TOML), kept as strings.
fn ids<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Id(String);
    impl<'de> Deserialize<'de> for Id {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Id;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a user id (a number like 123456789) or \"@username\"")
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Id, E> {
                    Ok(Id(v.to_string()))
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Id, E> {
                    Ok(Id(v.to_string()))
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Id, E> {
                    Ok(Id(v.to_string()))
                }
            }
            d.deserialize_any(V)
        }
    }
    Ok(Vec::<Id>::deserialize(d)?.into_iter().map(|Id(s)| s).collect())
}

impl Default for TelegramConfig {
    fn default() -> Self {
        TelegramConfig {
            token: None,
            token_env: None,
            allow_from: Vec::new(),
            api_base: HttpUrl("https://api.telegram.org".into()),
            max_image_px: 1280,
            max_file_mb: 20,
            progress: true,
            buttons: ReportButtons::Reminders,
            tomorrow_at: "09:00".into(),
        }
    }
}

/// `HH:MM` (24 h) as (hour, minute).
pub fn parse_hh_mm(text: &str) -> Option<(i8, i8)> {
    let (h, m) = text.trim().split_once(':')?;
    let (h, m) = (h.parse::<i8>().ok()?, m.parse::<i8>().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some((h, m))
}

impl TelegramConfig {
    pub fn token(&self) -> Option<Secret> {
        self.token.clone().or_else(|| self.token_env.as_deref().and_then(secret_from_env))
    }
}

/// `[mqtt]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// `mqtt://host:1883` or `mqtts://host:8883`; unset: no MQTT.
    pub url: Option<MqttUrl>,
    /// Device name: client id and topic prefix. Default: the host name.
    pub device: Option<String>,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub password_env: Option<String>,
    /// Home Assistant MQTT discovery.
    pub discovery: bool,
    /// Default `bramble/<device>`.
    pub topic_prefix: Option<String>,
    /// Topic patterns the agent's `mqtt_publish` tool may publish to.
    pub publish_allow: Vec<String>,
    pub trigger: Vec<MqttTrigger>,
    /// `<prefix>/in` (agent turns) and `<prefix>/run/<job>` (and Home
    /// Assistant's buttons). `false`: reports and state go out, nothing
    /// comes in but the configured triggers.
    pub inbound: bool,
    /// MQTT keep-alive: a PINGREQ this often when idle (5 s … 65535 s). The
    /// broker publishes our last will (`offline`) 1.5 × this after the board
    /// goes silent without a goodbye (power cut, network gone); a broker that
    /// stopped answering is noticed after at most 2 × this.
    pub keep_alive: Dur,
    /// Model turns a minute that one source on the broker may start
    /// (`<prefix>/in`; the message triggers together); more are dropped. 0: no limit.
    pub turns_per_minute: u32,
    /// How many of those may come at once.
    pub turn_burst: u32,
    /// Which MQTT version to speak: `auto` (5, and 3.1.1 for a broker that
    /// does not speak 5, remembered until the daemon restarts), `5`, `3.1.1`.
    pub protocol: MqttProtocol,
    /// The largest MQTT packet bramble sends, in bytes (a report, a record, a
    /// discovery document): a larger one is refused before it is sent, with
    /// an error that says so. MQTT 5 brokers also announce their own limit,
    /// which is obeyed; an MQTT 3.1.1 broker cannot, so set this to its limit
    /// (mosquitto's `message_size_limit`) when it has one.
    pub max_packet: u32,
}

/// `[mqtt] protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum MqttProtocol {
    /// MQTT 5, or 3.1.1 when the broker does not speak 5.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "5")]
    V5,
    #[serde(rename = "3.1.1")]
    V311,
}

impl std::fmt::Display for MqttProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MqttProtocol::Auto => "auto",
            MqttProtocol::V5 => "5",
            MqttProtocol::V311 => "3.1.1",
        })
    }
}

/// `[mqtt] max_packet` by default: 1 MiB (an LLM answer is bigger than
/// rumqttc's 10 KiB default).
pub const MQTT_MAX_PACKET: u32 = 1024 * 1024;

/// `[mqtt] keep_alive` by default.
pub const MQTT_KEEP_ALIVE: Dur = Dur::secs(300);

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            url: None,
            device: None,
            username: None,
            password: None,
            password_env: None,
            discovery: true,
            topic_prefix: None,
            publish_allow: Vec::new(),
            trigger: Vec::new(),
            inbound: true,
            keep_alive: MQTT_KEEP_ALIVE,
            turns_per_minute: 20,
            turn_burst: 5,
            protocol: MqttProtocol::Auto,
            max_packet: MQTT_MAX_PACKET,
        }
    }
}

/// An `mqtt://` or `mqtts://` broker URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl<'de> Deserialize<'de> for MqttUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bad = || {
            serde::de::Error::custom(format!(
                "`{text}` is not a broker URL: expected `mqtt://host:1883` or `mqtts://host:8883`"
            ))
        };
        let (tls, rest) = if let Some(r) = text.strip_prefix("mqtt://") {
            (false, r)
        } else if let Some(r) = text.strip_prefix("mqtts://") {
            (true, r)
        } else {
            return Err(bad());
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, p.parse::<u16>().map_err(|_| bad())?),
            _ => (rest, if tls { 8883 } else { 1883 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains('/') {
            return Err(bad());
        }
        Ok(MqttUrl { tls, host: host.to_string(), port })
    }
}

/// `[[mqtt.trigger]]`: a topic that starts an agent turn or a command.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawTrigger")]
pub struct MqttTrigger {
    pub topic: String,
    pub action: TriggerAction,
    pub deliver: Vec<Target>,
    /// At most one run per this interval; messages in between are dropped (and counted).
    pub min_interval: Dur,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerAction {
    /// A template rendered into an agent turn.
    Message(String),
    /// A command run in the sandbox with the payload on stdin.
    Exec(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrigger {
    topic: String,
    message: Option<String>,
    exec: Option<String>,
    #[serde(default)]
    deliver: Vec<Target>,
    min_interval: Option<Dur>,
}

impl TryFrom<RawTrigger> for MqttTrigger {
    type Error = String;
    fn try_from(r: RawTrigger) -> Result<Self, String> {
        if r.topic.trim().is_empty() {
            return Err("a trigger needs a `topic`".into());
        }
        let action = match (r.message, r.exec) {
            (Some(m), None) => TriggerAction::Message(m),
            (None, Some(e)) => TriggerAction::Exec(e),
            _ => return Err(format!("trigger `{}` needs exactly one of `message` or `exec`", r.topic)),
        };
        let min_interval = r.min_interval.unwrap_or(match action {
            TriggerAction::Message(_) => Dur::secs(60),
            TriggerAction::Exec(_) => Dur::secs(1),
        });
        Ok(MqttTrigger { topic: r.topic, action, deliver: r.deliver, min_interval })
    }
}
