//! The message bus: bounded queues between channels and the agent.
//!
//! Channels (Telegram, MQTT, the CLI) never call the agent directly: they
//! publish an [`InboundMessage`] and the agent publishes an [`OutboundMessage`]
//! addressed to a delivery [`Target`]. Adding a channel touches neither the
//! agent nor the scheduler, as in nanobot. The queues are bounded: a flood of
//! inbound messages waits (back-pressure) instead of growing memory on a
//! 512 MB board.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::mpsc;

/// Capacity of each bus queue. Small on purpose: producers wait when it is full.
pub const BUS_CAPACITY: usize = 64;

/// Where a report goes. Written in config and on the CLI as
/// `telegram:<chat_id>`, `mqtt`, `mqtt:<topic>`, `ha:notify.<service>`, `log`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A Telegram chat.
    Telegram(String),
    /// The device's default MQTT report topic (`None`) or a given topic.
    Mqtt(Option<String>),
    /// A Home Assistant notify service (`ha:notify.mobile_app_pixel`): the
    /// service name after `notify.`.
    HomeAssistant(String),
    /// The daemon's log (journald under systemd).
    Log,
    /// The local terminal (`bramble agent`); not valid in config.
    Cli,
}

impl Target {
    /// The target that means "back to the chat a message came from".
    pub fn origin(channel: &str, chat_id: &str) -> Target {
        match channel {
            "telegram" => Target::Telegram(chat_id.to_string()),
            "mqtt" if !chat_id.is_empty() => Target::Mqtt(Some(chat_id.to_string())),
            "mqtt" => Target::Mqtt(None),
            "cli" => Target::Cli,
            _ => Target::Log,
        }
    }

    /// The channel that delivers to this target.
    pub fn channel(&self) -> &'static str {
        match self {
            Target::Telegram(_) => "telegram",
            Target::Mqtt(_) => "mqtt",
            Target::HomeAssistant(_) => "ha",
            Target::Log => "log",
            Target::Cli => "cli",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Telegram(chat) => write!(f, "telegram:{chat}"),
            Target::Mqtt(None) => f.write_str("mqtt"),
            Target::Mqtt(Some(topic)) => write!(f, "mqtt:{topic}"),
            Target::HomeAssistant(service) => write!(f, "ha:notify.{service}"),
            Target::Log => f.write_str("log"),
            Target::Cli => f.write_str("cli"),
        }
    }
}

impl FromStr for Target {
    type Err = String;
    /// A target as a user, the config or the agent writes it. An MQTT topic
    /// must follow MQTT's rules ([`crate::util::mqtt::check_topic`]): a broker
    /// closes the connection on a publish that does not, and a report queued
    /// for one would stall the channel.
    fn from_str(text: &str) -> Result<Self, String> {
        Target::parse(text, true)
    }
}

impl Target {
    /// `strict`: the whole of MQTT's topic rules; otherwise only what earlier
    /// versions checked (no wildcards), for targets read back from state files.
    fn parse(text: &str, strict: bool) -> Result<Target, String> {
        let t = text.trim();
        let expected = "expected `telegram:<chat_id>`, `mqtt`, `mqtt:<topic>`, `ha:notify.<service>` or `log`";
        match t.split_once(':') {
            None if t == "mqtt" => Ok(Target::Mqtt(None)),
            None if t == "log" => Ok(Target::Log),
            None if t == "cli" => Ok(Target::Cli),
            Some(("telegram", chat)) => {
                let chat = chat.trim();
                let numeric = chat.strip_prefix('-').unwrap_or(chat);
                if (!numeric.is_empty() && numeric.bytes().all(|b| b.is_ascii_digit()))
                    || chat.starts_with('@') && chat.len() > 1
                {
                    Ok(Target::Telegram(chat.to_string()))
                } else {
                    Err(format!("`{text}`: a Telegram target needs a numeric chat id (or @channelname), like `telegram:123456789`"))
                }
            }
            Some(("mqtt", topic)) => {
                let topic = topic.trim();
                if topic.is_empty() || topic.contains(['+', '#']) {
                    Err(format!(
                        "`{text}`: an MQTT target needs a topic without wildcards, like `mqtt:home/bramble/report`"
                    ))
                } else if let Some(e) = crate::util::mqtt::check_topic(topic).err().filter(|_| strict) {
                    Err(format!("`{}`: {e}", text.escape_debug()))
                } else {
                    Ok(Target::Mqtt(Some(topic.to_string())))
                }
            }
            Some(("ha", rest)) => match rest.trim().strip_prefix("notify.") {
                Some(service)
                    if !service.is_empty()
                        && service.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
                {
                    Ok(Target::HomeAssistant(service.to_string()))
                }
                _ => Err(format!(
                    "`{text}`: a Home Assistant target is a notify service, like `ha:notify.mobile_app_pixel`"
                )),
            },
            _ => Err(format!("`{text}` is not a delivery target: {expected}")),
        }
    }
}

/// Read back as earlier versions wrote it: `jobs.json` and the outbox are read
/// whole, and a stricter rule here would make one old target cost every job
/// or report in the file. What cannot be delivered is refused where it is
/// delivered (the MQTT channel checks every topic) and said by `bramble check`
/// for the config; everything new is checked by [`FromStr`].
impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Target::parse(&String::deserialize(d)?, false).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where a conversation happens: the channel, the chat in it, and the session
/// that keeps its history. Every message, turn, job, pending record and tool
/// call carries one of these, so the three travel together and are never
/// re-declared (stored as three flat string fields where it is written to disk).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conversation {
    /// `telegram`, `mqtt`, `cli`, `system`.
    pub channel: String,
    /// The chat within the channel (Telegram chat id, MQTT reply topic, …).
    pub chat_id: String,
    /// The session the turn belongs to (`telegram:<chat>`, `cli:direct`, `heartbeat`, `cron:<job>`).
    pub session_key: String,
}

impl Conversation {
    pub fn new(channel: impl Into<String>, chat_id: impl Into<String>, session_key: impl Into<String>) -> Self {
        Conversation { channel: channel.into(), chat_id: chat_id.into(), session_key: session_key.into() }
    }

    /// A session of the local terminal.
    pub fn cli(session_key: impl Into<String>) -> Self {
        Conversation::new("cli", "direct", session_key)
    }

    /// Where an answer goes: back to the chat.
    pub fn reply_target(&self) -> Target {
        Target::origin(&self.channel, &self.chat_id)
    }
}

/// Who asked for something: the person a turn acts for, and whose rights a
/// job made in it keeps ([`crate::scheduler::Job::creator`]). Decided by the
/// channel that authenticated them, never from text in the message.
///
/// On disk it is one string: `owner`, `telegram:<user id>`,
/// `member:<unix user>`, `anonymous`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The owner: the terminal, root or the service's user at the CLI, the
    /// config's own jobs and the heartbeat.
    Owner,
    /// A Telegram user, by id: an `allow_from` user or a paired one. Their
    /// rights end when they are revoked or leave `allow_from`.
    Telegram(i64),
    /// A member of the installed service's group, by user name (`bramble
    /// cron …` through the control socket): `[service] members` says what
    /// they may do.
    Member(String),
    /// Whoever can publish to the broker, or set a Home Assistant state:
    /// nobody in particular, trusted with nothing that outlives the turn.
    Anonymous,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Owner => f.write_str("owner"),
            Principal::Telegram(id) => write!(f, "telegram:{id}"),
            Principal::Member(user) => write!(f, "member:{user}"),
            Principal::Anonymous => f.write_str("anonymous"),
        }
    }
}

impl FromStr for Principal {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "owner" => Ok(Principal::Owner),
            None if text == "anonymous" => Ok(Principal::Anonymous),
            Some(("telegram", id)) => {
                id.parse().map(Principal::Telegram).map_err(|_| format!("`{text}`: a Telegram user id is a number"))
            }
            Some(("member", user)) if !user.is_empty() => Ok(Principal::Member(user.to_string())),
            _ => Err(format!(
                "`{text}` is not a principal: expected `owner`, `telegram:<id>`, `member:<user>` or `anonymous`"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Principal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Principal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A message for the agent, from some channel.
#[derive(Debug)]
pub struct InboundMessage {
    /// Where it came from, and the session its turn belongs to.
    pub conversation: Conversation,
    /// Who sent it (for logs; authorisation happened in the channel).
    pub sender: String,
    /// Who sent it, as the channel authenticated them: what a job made in
    /// this turn may do later.
    pub principal: Principal,
    pub text: String,
    /// Where the answer goes.
    pub reply_to: Target,
    /// Files that came with it, already saved in the workspace.
    pub attachments: Vec<Attachment>,
}

/// A file that came with a message (a voice note, a photo, a document),
/// saved in the workspace's `inbox/` before the channel confirmed the
/// message to its server: what the turn reads, and what is left if it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub kind: AttachmentKind,
    /// Relative to the workspace (`inbox/2026-11-23/voice-12.ogg`).
    pub path: String,
    /// `audio/ogg`, `image/jpeg`, `application/pdf`, …
    pub mime: String,
    pub size: u64,
}

/// What a turn does with an [`Attachment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentKind {
    /// Speech: transcribed, and the turn runs on the transcript.
    Voice { seconds: u64 },
    /// Shown to the model as an image part (when it can see).
    Image,
    /// Any other file: the model is told its path and may read it.
    File,
}

impl Attachment {
    /// How the session (and a model that cannot see it) knows the file:
    /// `[photo: inbox/…/photo-12.jpg]`, `[file: inbox/…/report.pdf, 12 KB, application/pdf]`.
    pub fn reference(&self) -> String {
        let size = human_size(self.size);
        match self.kind {
            AttachmentKind::Voice { seconds } => {
                format!("[voice note {}:{:02}: {}]", seconds / 60, seconds % 60, self.path)
            }
            AttachmentKind::Image => format!("[image: {}, {size}]", self.path),
            AttachmentKind::File => {
                format!("[file: {}, {size}, {}; read it with read_file]", self.path, self.mime)
            }
        }
    }
}

/// `812 B`, `12 KB`, `3.4 MB`.
pub fn human_size(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{} KB", b.div_ceil(1024)),
        b => format!("{:.1} MB", b as f64 / (1024.0 * 1024.0)),
    }
}

/// A message from the agent (or the scheduler) to a delivery target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundMessage {
    pub target: Target,
    pub text: String,
    /// Workspace files sent with it (the `message` tool's `attach`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
}

impl OutboundMessage {
    /// A text message.
    pub fn text(target: Target, text: impl Into<String>) -> OutboundMessage {
        OutboundMessage { target, text: text.into(), attach: Vec::new() }
    }
}

/// The two queues. Cloning the senders is how producers get access.
pub struct Bus {
    pub inbound_tx: mpsc::Sender<InboundMessage>,
    pub inbound_rx: mpsc::Receiver<InboundMessage>,
    pub outbound_tx: mpsc::Sender<OutboundMessage>,
    pub outbound_rx: mpsc::Receiver<OutboundMessage>,
}

impl Bus {
    pub fn new() -> Bus {
        let (inbound_tx, inbound_rx) = mpsc::channel(BUS_CAPACITY);
        let (outbound_tx, outbound_rx) = mpsc::channel(BUS_CAPACITY);
        Bus { inbound_tx, inbound_rx, outbound_tx, outbound_rx }
    }
}

impl Default for Bus {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip() {
        for t in [
            "telegram:123456",
            "telegram:-100123",
            "telegram:@news",
            "mqtt",
            "mqtt:home/report",
            "log",
            "ha:notify.mobile_app_pixel",
        ] {
            let parsed: Target = t.parse().unwrap();
            assert_eq!(parsed.to_string(), t);
        }
    }

    #[test]
    fn bad_targets_say_what_is_expected() {
        for t in [
            "telegram:",
            "telegram:abc",
            "mqtt:a/+/b",
            "mqtt:",
            "email:me",
            "slack",
            "ha:",
            "ha:light.x",
            "ha:notify.",
            "ha:notify.a/b",
            "mqtt:$SYS/broker/load",
        ] {
            let err = t.parse::<Target>().unwrap_err();
            assert!(err.contains(t.trim()), "{err}");
        }
        // MQTT's topic rules: what a broker would close the connection on is refused now.
        for (t, says) in [("mqtt:a\0b", "U+0000"), ("mqtt:a\u{1}b", "U+0001"), ("mqtt:$SYS/x", "`$`")] {
            let err = t.parse::<Target>().unwrap_err();
            assert!(err.contains(says), "{t:?}: {err}");
        }
        let long = format!("mqtt:{}", "a".repeat(65536));
        assert!(long.parse::<Target>().unwrap_err().contains("65535 bytes"));
        // Read back from a state file as earlier versions wrote it: kept, refused at delivery.
        let old: Target = serde_json::from_str("\"mqtt:$SYS/x\\u0000\"").unwrap();
        assert_eq!(old, Target::Mqtt(Some("$SYS/x\0".into())));
        assert!(serde_json::from_str::<Target>("\"mqtt:a/#\"").is_err());
        assert_eq!("ha:notify.mobile_app_x".parse::<Target>().unwrap().channel(), "ha");
    }

    #[test]
    fn principals_round_trip_as_one_string() {
        for p in [Principal::Owner, Principal::Telegram(42), Principal::Member("ann".into()), Principal::Anonymous] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Principal>(&json).unwrap(), p);
        }
        assert_eq!(serde_json::to_string(&Principal::Telegram(-5)).unwrap(), "\"telegram:-5\"");
        for bad in ["", "root", "telegram:x", "member:", "telegram"] {
            assert!(bad.parse::<Principal>().is_err(), "{bad}");
        }
    }
}
