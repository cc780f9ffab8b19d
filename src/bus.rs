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

pub use crate::util::ids::{
    is_feishu_id, is_matrix_room, is_matrix_user, is_ntfy_topic, is_plain_address, is_signal_chat, is_signal_group,
    is_signal_number, is_signal_uuid, is_webhook_name,
};

/// Capacity of each bus queue. Small on purpose: producers wait when it is full.
pub const BUS_CAPACITY: usize = 64;

/// Where a report goes. Written in config and on the CLI as
/// `telegram:<chat_id>`, `mqtt`, `mqtt:<topic>`, `ha:notify.<service>`, `log`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A Telegram chat.
    Telegram(String),
    /// A Feishu / Lark chat, by `chat_id` (`oc_…`): a direct chat or a group
    /// (the endpoint, China or international, is `[feishu] domain`).
    Feishu(String),
    /// A Discord channel (a DM or a guild text channel), by its snowflake id.
    Discord(u64),
    /// A mailbox (`email:<address>`), or its daily digest (`?digest=HH:MM`).
    Email(EmailTarget),
    /// A Matrix room, by id (`!abc:server`) or alias (`#room:server`, resolved when delivered).
    Matrix(String),
    /// A Signal chat through signal-cli: a number (`+4915…`), an account
    /// uuid, or a group (`group.<base64 id>`).
    Signal(String),
    /// The device's default MQTT report topic (`None`) or a given topic.
    Mqtt(Option<String>),
    /// A `[[webhook]]` with a `url`, by name (`webhook:<name>`): a signed
    /// JSON report POSTed there.
    Webhook(String),
    /// An ntfy topic (`ntfy:<topic>`) on `[ntfy] server`: a push notification.
    Ntfy(String),
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
    pub fn origin(channel: &Channel, chat_id: &str) -> Target {
        match channel {
            Channel::Telegram => Target::Telegram(chat_id.to_string()),
            Channel::Feishu => Target::Feishu(chat_id.to_string()),
            Channel::Discord => chat_id.parse().map(Target::Discord).unwrap_or(Target::Log),
            Channel::Email => Target::Email(EmailTarget { address: chat_id.to_string(), digest: None }),
            Channel::Matrix => Target::Matrix(chat_id.to_string()),
            Channel::Signal => Target::Signal(chat_id.to_string()),
            Channel::Mqtt if !chat_id.is_empty() => Target::Mqtt(Some(chat_id.to_string())),
            Channel::Mqtt => Target::Mqtt(None),
            // A caller is answered `202 Accepted`, not with the turn's answer:
            // an endpoint's answer goes to its `deliver` targets.
            Channel::Webhook => Target::Log,
            // A command typed in the ntfy app is answered on its topic.
            Channel::Ntfy => Target::Ntfy(chat_id.to_string()),
            Channel::Cli => Target::Cli,
            Channel::HomeAssistant | Channel::System | Channel::Other(_) => Target::Log,
        }
    }

    /// The channel that delivers to this target.
    pub fn channel(&self) -> &'static str {
        match self {
            Target::Telegram(_) => "telegram",
            Target::Feishu(_) => "feishu",
            Target::Discord(_) => "discord",
            Target::Email(_) => "email",
            Target::Matrix(_) => "matrix",
            Target::Signal(_) => "signal",
            Target::Mqtt(_) => "mqtt",
            Target::Webhook(_) => "webhook",
            Target::Ntfy(_) => "ntfy",
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
            Target::Feishu(chat) => write!(f, "feishu:{chat}"),
            Target::Discord(channel) => write!(f, "discord:{channel}"),
            Target::Email(t) => write!(f, "email:{t}"),
            Target::Matrix(room) => write!(f, "matrix:{room}"),
            Target::Signal(chat) => write!(f, "signal:{chat}"),
            Target::Mqtt(None) => f.write_str("mqtt"),
            Target::Mqtt(Some(topic)) => write!(f, "mqtt:{topic}"),
            Target::Webhook(name) => write!(f, "webhook:{name}"),
            Target::Ntfy(topic) => write!(f, "ntfy:{topic}"),
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
        let expected =
            "expected `telegram:<chat_id>`, `discord:<channel id>`, `feishu:<chat_id>`, `matrix:<room>`, `signal:<number|uuid|group.<id>>`, `email:<address>`, `mqtt`, `mqtt:<topic>`, `webhook:<name>`, `ntfy:<topic>`, `ha:notify.<service>` or `log`";
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
            Some(("feishu", chat)) => match chat.trim() {
                chat if is_feishu_id(chat, "oc_") => Ok(Target::Feishu(chat.to_string())),
                // Read back leniently: an odd chat is refused where it is delivered.
                chat if !strict && !chat.is_empty() => Ok(Target::Feishu(chat.to_string())),
                _ => Err(format!("`{text}`: a Feishu / Lark target is a chat_id, like `feishu:oc_a0553eda9014c201e6969b478895c230`")),
            },
            Some(("discord", id)) => match id.trim().parse::<u64>() {
                Ok(id) if id > 0 => Ok(Target::Discord(id)),
                _ => Err(format!("`{text}`: a Discord target is a channel id (a number), like `discord:1098765432101234567`")),
            },
            Some(("email", rest)) => EmailTarget::parse(rest.trim()).map(Target::Email).map_err(|why| {
                format!("`{text}` is not a delivery target: {why}, like `email:me@example.org` or `email:me@example.org?digest=07:00`")
            }),
            Some(("matrix", room)) => match room.trim() {
                room if is_matrix_room(room) => Ok(Target::Matrix(room.to_string())),
                // Read back leniently: an odd room is refused where it is delivered.
                room if !strict && !room.is_empty() => Ok(Target::Matrix(room.to_string())),
                _ => Err(format!(
                    "`{text}`: a Matrix target is a room id or alias, like `matrix:!abc:example.org` or `matrix:#room:example.org`"
                )),
            },
            Some(("signal", chat)) => match chat.trim() {
                chat if is_signal_chat(chat) => Ok(Target::Signal(chat.to_string())),
                // Read back leniently: an odd chat is refused where it is delivered.
                chat if !strict && !chat.is_empty() => Ok(Target::Signal(chat.to_string())),
                _ => Err(format!(
                    "`{text}`: a Signal target is a number, an account uuid or a group, like `signal:+4915112345678` or `signal:group.<base64 id>`"
                )),
            },
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
            Some(("webhook", name)) => {
                let name = name.trim();
                // Read back from a state file: any name (refused at delivery when unknown).
                if is_webhook_name(name) || (!strict && !name.is_empty()) {
                    Ok(Target::Webhook(name.to_string()))
                } else {
                    Err(format!(
                        "`{text}`: a webhook target names a [[webhook]] with a `url`, like `webhook:node_red` \
                         (1 to 64 of `a-z 0-9 _ -`)"
                    ))
                }
            }
            Some(("ntfy", topic)) => {
                let topic = topic.trim();
                if is_ntfy_topic(topic) || (!strict && !topic.is_empty()) {
                    Ok(Target::Ntfy(topic.to_string()))
                } else {
                    Err(format!("`{text}`: an ntfy target is a topic, like `ntfy:bramble-reports` (1 to 64 of `A-Z a-z 0-9 _ -`)"))
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

/// An `email:` target: an address, and for a daily digest the local time it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EmailTarget {
    /// `me@example.org`: checked to be one plain address (nothing a mail
    /// header could be split on).
    pub address: String,
    /// `?digest=07:00`: reports are collected and sent once a day at this (hour, minute).
    pub digest: Option<(i8, i8)>,
}

impl EmailTarget {
    /// `addr` or `addr?digest=HH:MM`; the error says what is wrong.
    fn parse(text: &str) -> Result<EmailTarget, &'static str> {
        let (address, query) = match text.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (text, None),
        };
        let digest = match query {
            None => None,
            Some(q) => {
                let time = q.strip_prefix("digest=").ok_or("the only option is `?digest=HH:MM`")?;
                Some(hh_mm(time).ok_or("a digest time is `HH:MM` (24 h)")?)
            }
        };
        if !is_plain_address(address) {
            return Err("an email target needs one plain address");
        }
        Ok(EmailTarget { address: address.to_string(), digest })
    }
}

impl fmt::Display for EmailTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.address)?;
        match self.digest {
            Some((h, m)) => write!(f, "?digest={h:02}:{m:02}"),
            None => Ok(()),
        }
    }
}

/// `HH:MM` (24 h) as (hour, minute).
fn hh_mm(text: &str) -> Option<(i8, i8)> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m) = (h.parse::<i8>().ok()?, m.parse::<i8>().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some((h, m))
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

/// The channel a conversation happens on. Decoded from its name once, here;
/// everything that decides by channel (trust, tools, reply targets) matches
/// this enum exhaustively, so a new channel is a compile error until each
/// decision is made for it. On disk it is its name (`telegram`, `mqtt`, …).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// `bramble agent`: the terminal.
    Cli,
    Telegram,
    /// A Feishu / Lark chat (direct or group).
    Feishu,
    /// A Discord DM or allow-listed guild channel.
    Discord,
    /// Mail from an allow-listed sender the receiving server authenticated.
    Email,
    /// A Matrix room.
    Matrix,
    /// A Signal chat (a person or a group) through a signal-cli daemon.
    Signal,
    Mqtt,
    /// `[[webhook]]` endpoints: whoever holds an endpoint's secret.
    Webhook,
    /// An `[ntfy] subscribe` topic: whoever can publish to it (a caller, not a person).
    Ntfy,
    /// Home Assistant's triggers.
    HomeAssistant,
    /// The scheduler's own sessions: the heartbeat, jobs made outside a chat.
    System,
    /// A channel this build does not know (a newer build's, or a future
    /// channel's files): treated as untrusted everywhere.
    Other(String),
}

impl Channel {
    /// Its name, as stored.
    pub fn name(&self) -> &str {
        match self {
            Channel::Cli => "cli",
            Channel::Telegram => "telegram",
            Channel::Feishu => "feishu",
            Channel::Discord => "discord",
            Channel::Email => "email",
            Channel::Matrix => "matrix",
            Channel::Signal => "signal",
            Channel::Mqtt => "mqtt",
            Channel::Webhook => "webhook",
            Channel::Ntfy => "ntfy",
            Channel::HomeAssistant => "homeassistant",
            Channel::System => "system",
            Channel::Other(name) => name,
        }
    }
}

impl From<&str> for Channel {
    fn from(name: &str) -> Channel {
        match name {
            "cli" => Channel::Cli,
            "telegram" => Channel::Telegram,
            "feishu" => Channel::Feishu,
            "discord" => Channel::Discord,
            "email" => Channel::Email,
            "matrix" => Channel::Matrix,
            "signal" => Channel::Signal,
            "mqtt" => Channel::Mqtt,
            "webhook" => Channel::Webhook,
            "ntfy" => Channel::Ntfy,
            "homeassistant" => Channel::HomeAssistant,
            "system" => Channel::System,
            other => Channel::Other(other.to_string()),
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Channel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Channel::from(String::deserialize(d)?.as_str()))
    }
}

impl Serialize for Channel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What a session is for, read from its key in one place
/// ([`Conversation::kind`]): a chat, a job's, the heartbeat's, a trigger's
/// or a sub-agent's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKind {
    /// A conversation with someone (`telegram:42`, `cli:direct`, `mqtt:kitchen`).
    Chat,
    /// A job made outside a chat (`cron:<name>`).
    Job(String),
    /// The heartbeat's session.
    Heartbeat,
    /// A trigger's turns (`trigger:<topic or entity>`).
    Trigger(String),
    /// A sub-agent's work (`subagent:<chat>`).
    Sub,
}

/// Where a turn came from, as `[policy.<name>]` names it: what decides which
/// tools it is offered (`tools::policy`) and whether it may write memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// `bramble agent`: the owner at the keyboard.
    Terminal,
    /// A chat with an `allow_from` user.
    Telegram,
    /// A Feishu / Lark message from a `[feishu] allow_from` user.
    Feishu,
    /// A Discord message from a `[discord] allow_from` user.
    Discord,
    /// Mail from an `[email] allow_from` sender, authenticated by DKIM or SPF.
    Email,
    /// A Matrix room message from a `[matrix] allow_from` user.
    Matrix,
    /// A Signal message from a `[signal] allow_from` number or uuid.
    Signal,
    /// A scheduled job's turn (made by a trusted origin).
    Job,
    /// The heartbeat.
    Heartbeat,
    /// `<prefix>/in`: whoever can publish to the broker.
    Mqtt,
    /// A `[[webhook]]` endpoint's turn: whoever holds its secret, with a
    /// payload anyone upstream (a form, a sensor) may have written.
    Webhook,
    /// A message on an `[ntfy] subscribe` topic: whoever can publish to it
    /// (the topic and, on a protected server, an access token).
    Ntfy,
    /// An `[[mqtt.trigger]]` or a Home Assistant trigger.
    Trigger,
    /// A `/on <board> …` turn the fleet's primary asked this board for
    /// (`[policy.fleet]`), authenticated by the fleet key (docs/fleet.md).
    Fleet,
}

impl Source {
    /// Every source, in the order `bramble status` lists them.
    pub const ALL: [Source; 14] = [
        Source::Terminal,
        Source::Telegram,
        Source::Feishu,
        Source::Discord,
        Source::Matrix,
        Source::Signal,
        Source::Email,
        Source::Job,
        Source::Heartbeat,
        Source::Mqtt,
        Source::Webhook,
        Source::Ntfy,
        Source::Trigger,
        Source::Fleet,
    ];

    /// Its name in `[policy.<name>]`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Terminal => "terminal",
            Source::Telegram => "telegram",
            Source::Feishu => "feishu",
            Source::Discord => "discord",
            Source::Email => "email",
            Source::Matrix => "matrix",
            Source::Signal => "signal",
            Source::Job => "job",
            Source::Heartbeat => "heartbeat",
            Source::Mqtt => "mqtt",
            Source::Webhook => "webhook",
            Source::Ntfy => "ntfy",
            Source::Trigger => "trigger",
            Source::Fleet => "fleet",
        }
    }

    pub fn from_name(name: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The source of a turn in `conversation` (`in_job`: run by the
    /// scheduler). A scheduled turn of a trusted chat is a job's, whatever
    /// chat made the job (the terminal's included: a job runs when nobody is
    /// at it); an untrusted channel stays untrusted, and so does a channel
    /// this build does not know.
    pub fn of(conversation: &Conversation, in_job: bool) -> Source {
        match (&conversation.channel, conversation.kind()) {
            (Channel::System, SessionKind::Heartbeat) => Source::Heartbeat,
            (Channel::Mqtt | Channel::HomeAssistant | Channel::Other(_), SessionKind::Trigger(_)) => Source::Trigger,
            // Only the fleet names a session `fleet:…` (`<prefix>/in` sessions are `mqtt:…`).
            (Channel::Mqtt, _) if conversation.session_key.starts_with(FLEET_SESSION) => Source::Fleet,
            (
                Channel::Cli
                | Channel::Telegram
                | Channel::Feishu
                | Channel::Discord
                | Channel::Matrix
                | Channel::Signal
                | Channel::Email
                | Channel::System,
                _,
            ) if in_job => Source::Job,
            (Channel::Cli, _) => Source::Terminal,
            (Channel::Telegram, _) => Source::Telegram,
            (Channel::Feishu, _) => Source::Feishu,
            (Channel::Discord, _) => Source::Discord,
            (Channel::Matrix, _) => Source::Matrix,
            (Channel::Signal, _) => Source::Signal,
            (Channel::Email, _) => Source::Email,
            (Channel::System, _) => Source::Job,
            (Channel::Mqtt, _) => Source::Mqtt,
            (Channel::Webhook, _) => Source::Webhook,
            (Channel::Ntfy, _) => Source::Ntfy,
            (Channel::HomeAssistant | Channel::Other(_), _) => Source::Trigger,
        }
    }
}

/// The session key prefix of turns the fleet's primary asked for (`fleet:<board>`).
pub const FLEET_SESSION: &str = "fleet:";

/// Where a conversation happens: the channel, the chat in it, and the session
/// that keeps its history. Every message, turn, job, pending record and tool
/// call carries one of these, so the three travel together and are never
/// re-declared (stored as three flat string fields where it is written to disk).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conversation {
    /// `telegram`, `mqtt`, `cli`, `system`, `homeassistant`.
    pub channel: Channel,
    /// The chat within the channel (Telegram chat id, MQTT reply topic, …).
    pub chat_id: String,
    /// The session the turn belongs to (`telegram:<chat>`, `cli:direct`, `heartbeat`, `cron:<job>`).
    pub session_key: String,
}

impl Conversation {
    pub fn new(channel: Channel, chat_id: impl Into<String>, session_key: impl Into<String>) -> Self {
        Conversation { channel, chat_id: chat_id.into(), session_key: session_key.into() }
    }

    /// What the session is for, from its key (the one place that reads it).
    pub fn kind(&self) -> SessionKind {
        let key = self.session_key.as_str();
        if key == "heartbeat" {
            return SessionKind::Heartbeat;
        }
        match key.split_once(':') {
            Some(("cron", name)) => SessionKind::Job(name.to_string()),
            Some(("trigger", label)) => SessionKind::Trigger(label.to_string()),
            Some(("subagent", _)) => SessionKind::Sub,
            _ => SessionKind::Chat,
        }
    }

    /// A session of the local terminal.
    pub fn cli(session_key: impl Into<String>) -> Self {
        Conversation::new(Channel::Cli, "direct", session_key)
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
/// `matrix:<@user:server>`, `member:<unix user>`, `anonymous`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The owner: the terminal, root or the service's user at the CLI, the
    /// config's own jobs and the heartbeat.
    Owner,
    /// A Telegram user, by id: an `allow_from` user or a paired one. Their
    /// rights end when they are revoked or leave `allow_from`.
    Telegram(i64),
    /// A Feishu / Lark user, by `open_id` (`ou_…`, per app): a `[feishu]
    /// allow_from` user. Their rights end when they leave `allow_from`.
    Feishu(String),
    /// A Discord user, by id: a `[discord] allow_from` user. Their rights end
    /// when they leave `allow_from`.
    Discord(u64),
    /// A mail sender, by address: an `[email] allow_from` address whose mail
    /// the receiving server authenticated (DKIM or SPF).
    Email(String),
    /// A Matrix user, by id (`@owner:example.org`): a `[matrix] allow_from`
    /// user. Their rights end when they leave `allow_from`.
    Matrix(String),
    /// A Signal account, by its uuid (the ACI signal-cli reports as
    /// `sourceUuid`; a number only where no uuid is known): a `[signal]
    /// allow_from` entry. Their rights end when they leave `allow_from`.
    Signal(String),
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
            Principal::Feishu(id) => write!(f, "feishu:{id}"),
            Principal::Discord(id) => write!(f, "discord:{id}"),
            Principal::Email(addr) => write!(f, "email:{addr}"),
            Principal::Matrix(id) => write!(f, "matrix:{id}"),
            Principal::Signal(id) => write!(f, "signal:{id}"),
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
            Some(("feishu", id)) if is_feishu_id(id, "ou_") => Ok(Principal::Feishu(id.to_string())),
            Some(("discord", id)) => {
                id.parse().map(Principal::Discord).map_err(|_| format!("`{text}`: a Discord user id is a number"))
            }
            Some(("email", addr)) if is_plain_address(addr) => Ok(Principal::Email(addr.to_string())),
            Some(("matrix", user)) if is_matrix_user(user) => Ok(Principal::Matrix(user.to_string())),
            Some(("signal", id)) if is_signal_uuid(id) || is_signal_number(id) => Ok(Principal::Signal(id.to_string())),
            Some(("member", user)) if !user.is_empty() => Ok(Principal::Member(user.to_string())),
            _ => Err(format!(
                "`{text}` is not a principal: expected `owner`, `telegram:<id>`, `feishu:<open_id>`, `discord:<id>`, `matrix:<@user:server>`, `signal:<uuid>`, `email:<address>`, `member:<user>` or `anonymous`"
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

/// What produced a report: decoded from its stored string once, here, so a
/// channel that routes on it (MQTT publishes heartbeat and alert reports on
/// their own topics) and the alerts that skip their own reports match this
/// enum, never a string. On disk (the outbox, its record) it is the string
/// earlier versions wrote: `agent`, `heartbeat`, `alert`, `job:<name>`,
/// `trigger:<topic or entity>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReportSource {
    /// An answer, or the `message` tool.
    Agent,
    /// The heartbeat's report.
    Heartbeat,
    /// An alert (`[alerts]`).
    Alert,
    /// A job's report, by the job's name.
    Job(String),
    /// A trigger's report, by its topic or entity.
    Trigger(String),
    /// A source this build does not know (a newer build's outbox): kept as
    /// it is, routed as an ordinary report.
    Other(String),
}

impl fmt::Display for ReportSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportSource::Agent => f.write_str("agent"),
            ReportSource::Heartbeat => f.write_str("heartbeat"),
            ReportSource::Alert => f.write_str("alert"),
            ReportSource::Job(name) => write!(f, "job:{name}"),
            ReportSource::Trigger(label) => write!(f, "trigger:{label}"),
            ReportSource::Other(text) => f.write_str(text),
        }
    }
}

impl ReportSource {
    /// The length of its stored string, without making it.
    pub fn stored_len(&self) -> usize {
        match self {
            ReportSource::Agent => "agent".len(),
            ReportSource::Heartbeat => "heartbeat".len(),
            ReportSource::Alert => "alert".len(),
            ReportSource::Job(name) => "job:".len() + name.len(),
            ReportSource::Trigger(label) => "trigger:".len() + label.len(),
            ReportSource::Other(text) => text.len(),
        }
    }
}

/// Decoded as stored; never fails (an unknown one is [`ReportSource::Other`]).
impl From<&str> for ReportSource {
    fn from(text: &str) -> ReportSource {
        match text.split_once(':') {
            None if text == "agent" => ReportSource::Agent,
            None if text == "heartbeat" => ReportSource::Heartbeat,
            None if text == "alert" => ReportSource::Alert,
            Some(("job", name)) => ReportSource::Job(name.to_string()),
            Some(("trigger", label)) => ReportSource::Trigger(label.to_string()),
            _ => ReportSource::Other(text.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for ReportSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ReportSource::from(String::deserialize(d)?.as_str()))
    }
}

impl Serialize for ReportSource {
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
            "discord:1098765432101234567",
            "matrix:!abc:example.org",
            "matrix:#ops:example.org",
            "matrix:!ppGSUgfWKuR7zlCFFkXAVXRQAsm0h8KECeOS-AACohQ",
            "signal:+4915112345678",
            "signal:7ccae375-cd51-4c82-8b1e-7be3280aa485",
            "signal:group.Pmpi+EfPWmsxiomLe9Nx2XF9HOE483p6iKiFj65iMwI=",
            "mqtt",
            "mqtt:home/report",
            "webhook:node_red",
            "ntfy:bramble-reports_1",
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
            "discord:",
            "discord:0",
            "discord:general",
            "discord:-5",
            "matrix:",
            "matrix:room",
            "matrix:@owner:example.org",
            "matrix:#a",
            "matrix:!a b",
            "matrix:#a b:x",
            "signal:",
            "signal:4915112345678",
            "signal:+49 151",
            "signal:group.",
            "signal:group.abc",
            "signal:7ccae375-cd51-4c82-8b1e",
            "mqtt:a/+/b",
            "mqtt:",
            "email:me",
            "slack",
            "ha:",
            "ha:light.x",
            "ha:notify.",
            "ha:notify.a/b",
            "mqtt:$SYS/broker/load",
            "webhook:",
            "webhook:Node Red",
            "webhook:a/b",
            "ntfy:",
            "ntfy:a/b",
            "ntfy:two words",
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
    fn email_targets_are_one_plain_address_and_maybe_a_digest_time() {
        for t in ["email:me@example.org", "email:me+bot@mail.example.org?digest=07:00"] {
            assert_eq!(t.parse::<Target>().unwrap().to_string(), t);
        }
        let t: Target = "email:me@example.org?digest=23:59".parse().unwrap();
        assert_eq!(t, Target::Email(EmailTarget { address: "me@example.org".into(), digest: Some((23, 59)) }));
        assert_eq!(t.channel(), "email");
        // Nothing a header could be split on, no second address, no other option.
        for bad in [
            "email:me@example.org\r\nBcc: x@y.z",
            "email:a@b.c,d@e.f",
            "email:<me@example.org>",
            "email:me@localhost",
            "email:me@example.org?digest=7:00",
            "email:me@example.org?digest=24:00",
            "email:me@example.org?cc=x@y.z",
        ] {
            let err = bad.parse::<Target>().unwrap_err();
            assert!(err.contains("not a delivery target"), "{bad}: {err}");
        }
        let c = Conversation::new(Channel::Email, "me@example.org", "email:me@example.org:1");
        assert_eq!(c.reply_target().to_string(), "email:me@example.org");
        assert_eq!(Source::of(&c, false), Source::Email);
        assert_eq!(Source::of(&c, true), Source::Job);
        assert_eq!("email:me@example.org".parse::<Principal>().unwrap(), Principal::Email("me@example.org".into()));
        assert!("email:nobody".parse::<Principal>().is_err());
    }

    #[test]
    fn conversations_keep_their_strings_on_disk() {
        // As jobs.json and pending records have stored them since wave 1.
        let old = r#"{"channel":"telegram","chat_id":"42","session_key":"telegram:42"}"#;
        let c: Conversation = serde_json::from_str(old).unwrap();
        assert_eq!(c.channel, Channel::Telegram);
        assert_eq!(serde_json::to_string(&c).unwrap(), old);
        // A channel from a newer build is kept as it is, and trusted with nothing.
        let new = r#"{"channel":"xmpp","chat_id":"room","session_key":"xmpp:room"}"#;
        let c: Conversation = serde_json::from_str(new).unwrap();
        assert_eq!(c.channel, Channel::Other("xmpp".into()));
        assert_eq!(serde_json::to_string(&c).unwrap(), new);
        assert_eq!(Source::of(&c, false), Source::Trigger);
        assert_eq!(Source::of(&c, true), Source::Trigger);
        assert_eq!(c.reply_target(), Target::Log);
        // A Matrix room is its own channel: trusted as a chat, answered in the room.
        let m: Conversation =
            serde_json::from_str(r#"{"channel":"matrix","chat_id":"!r:x","session_key":"matrix:!r:x"}"#).unwrap();
        assert_eq!((Source::of(&m, false), Source::of(&m, true)), (Source::Matrix, Source::Job));
        assert_eq!(m.reply_target(), Target::Matrix("!r:x".into()));
    }

    #[test]
    fn a_session_key_says_what_the_session_is_for() {
        let kind = |key: &str| Conversation::new(Channel::System, "x", key).kind();
        assert_eq!(kind("heartbeat"), SessionKind::Heartbeat);
        assert_eq!(kind("cron:backup"), SessionKind::Job("backup".into()));
        assert_eq!(kind("trigger:zigbee2mqtt/door"), SessionKind::Trigger("zigbee2mqtt/door".into()));
        assert_eq!(kind("subagent:42"), SessionKind::Sub);
        for chat in ["telegram:42", "cli:direct", "mqtt:kitchen", "heartbeat2"] {
            assert_eq!(kind(chat), SessionKind::Chat, "{chat}");
        }
    }

    #[test]
    fn report_sources_keep_their_strings_on_disk() {
        for (text, source) in [
            ("agent", ReportSource::Agent),
            ("heartbeat", ReportSource::Heartbeat),
            ("alert", ReportSource::Alert),
            ("job:backup", ReportSource::Job("backup".into())),
            ("job:a:b", ReportSource::Job("a:b".into())),
            ("trigger:zigbee2mqtt/+/door", ReportSource::Trigger("zigbee2mqtt/+/door".into())),
            ("trigger:binary_sensor.front_door", ReportSource::Trigger("binary_sensor.front_door".into())),
            // A newer build's source, or a near miss: kept as written, routed as an ordinary report.
            ("webhook:x", ReportSource::Other("webhook:x".into())),
            ("alerts", ReportSource::Other("alerts".into())),
            ("", ReportSource::Other(String::new())),
        ] {
            let json = serde_json::to_string(text).unwrap();
            let read: ReportSource = serde_json::from_str(&json).unwrap();
            assert_eq!(read, source, "{text}");
            assert_eq!(serde_json::to_string(&read).unwrap(), json, "{text}");
            assert_eq!(read.stored_len(), text.len(), "{text}");
        }
    }

    #[test]
    fn principals_round_trip_as_one_string() {
        for p in [
            Principal::Owner,
            Principal::Telegram(42),
            Principal::Discord(80351110224678912),
            Principal::Matrix("@ann:example.org".into()),
            Principal::Signal("7ccae375-cd51-4c82-8b1e-7be3280aa485".into()),
            Principal::Member("ann".into()),
            Principal::Anonymous,
        ] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Principal>(&json).unwrap(), p);
        }
        assert_eq!(serde_json::to_string(&Principal::Telegram(-5)).unwrap(), "\"telegram:-5\"");
        for bad in [
            "",
            "root",
            "telegram:x",
            "member:",
            "telegram",
            "matrix:ann",
            "matrix:@ann",
            "signal:ann",
            "discord:x",
            "discord:-1",
        ] {
            assert!(bad.parse::<Principal>().is_err(), "{bad}");
        }
    }
    #[test]
    fn feishu_targets_and_principals_are_checked() {
        let t: Target = "feishu:oc_a0553eda9014c201e6969b478895c230".parse().unwrap();
        assert_eq!(t.to_string(), "feishu:oc_a0553eda9014c201e6969b478895c230");
        assert_eq!(t.channel(), "feishu");
        for bad in ["feishu:", "feishu:ou_abc", "feishu:oc_", "feishu:oc_a b", "feishu:chat"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
        assert_eq!(Target::parse("feishu:odd", false), Ok(Target::Feishu("odd".into())), "read back leniently");
        let p: Principal = "feishu:ou_7d8a6e6df7621556ce0d21922b676706".parse().unwrap();
        assert_eq!(p.to_string(), "feishu:ou_7d8a6e6df7621556ce0d21922b676706");
        assert!("feishu:oc_abc".parse::<Principal>().is_err() && "feishu:".parse::<Principal>().is_err());
        let c = Conversation::new(Channel::Feishu, "oc_x", "feishu:oc_x");
        assert_eq!((Source::of(&c, false), Source::of(&c, true)), (Source::Feishu, Source::Job));
        assert_eq!(c.reply_target(), Target::Feishu("oc_x".into()));
        assert_eq!(Channel::from("feishu"), Channel::Feishu);
    }
}
