//! `[fleet]`: several boards, one chat (docs/fleet.md).
//!
//! Opt-in: without a `[fleet]` table (no `name`) a board is on its own,
//! exactly as before. The types here are what the rest of the crate speaks
//! about boards: a [`BoardName`] is checked once, where it is read, because
//! it becomes an MQTT topic level (`bramble/<board>/…`) and a broker user
//! name in the ACL `bramble fleet acl` prints.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{secret_from_env, Dur, Secret};

/// The shortest fleet key accepted, in bytes: 128 bits of a random hex or base64 string.
pub const MIN_KEY_BYTES: usize = 32;

/// A board's name: 1 to 32 of `a-z 0-9 _ -`, not `any` (which `cron add --on
/// any` means). Lower case only, so `Garage` and `garage` cannot be two boards
/// with one topic space on a case-insensitive dashboard.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoardName(String);

/// Why a text is not a board name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoardNameError {
    #[error("`{0}` is not a board name: expected 1 to 32 characters from `a-z 0-9 _ -`, like `garage`")]
    Invalid(String),
    #[error("`any` is not a board's name: `--on any` means \"whichever board wins the slot\"")]
    Any,
}

impl BoardName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for BoardName {
    type Err = BoardNameError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-';
        if text == "any" {
            return Err(BoardNameError::Any);
        }
        if text.is_empty() || text.len() > 32 || !text.bytes().all(ok) {
            return Err(BoardNameError::Invalid(text.escape_debug().to_string()));
        }
        Ok(BoardName(text.to_string()))
    }
}

impl fmt::Display for BoardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for BoardName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for BoardName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// `[fleet] role`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetRole {
    /// Owns the chat channels; commands the nodes; delivers their reports.
    #[default]
    Primary,
    /// Runs its own jobs and answers the primary; owns no chat.
    Node,
    /// A node that takes the chat channels over while the primary's status
    /// has said `offline` for `takeover_after`, and hands them back when it
    /// returns (docs/fleet.md, "The chat survives the primary").
    Standby,
}

impl FleetRole {
    pub fn as_str(self) -> &'static str {
        match self {
            FleetRole::Primary => "primary",
            FleetRole::Node => "node",
            FleetRole::Standby => "standby",
        }
    }
}

/// `[fleet]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// This board's name; unset: no fleet (a board on its own, as before).
    pub name: Option<BoardName>,
    pub role: FleetRole,
    /// On a node: the board whose commands it takes (and where its reports go).
    pub primary: Option<BoardName>,
    /// The variable (or systemd credential) holding the fleet key: one
    /// secret shared by the boards, on top of each board's own broker account.
    pub key_env: Option<String>,
    /// How long a `/on` turn or a remote `cron` command waits for the board's answer.
    pub timeout: Dur,
    /// A command older (or further in the future) than this is refused; its
    /// nonce is remembered this long.
    pub replay_window: Dur,
    /// How long a delivered report's key (`job@slot`) is kept to drop its duplicates.
    pub dedup_window: Dur,
    /// NATS server for `cron add --on any` (Tier 3); unset: `--on any` is refused.
    pub nats_url: Option<String>,
    /// On a standby: how long the primary's status must have said `offline`
    /// before this board polls the chat (at least [`MIN_TAKEOVER`]).
    pub takeover_after: Dur,
    /// This board's NATS account (its own user, like its broker account).
    pub nats_user: Option<String>,
    /// The variable (or systemd credential) holding that account's password.
    pub nats_password_env: Option<String>,
    /// The JetStream key-value bucket the boards claim slots in (made if missing).
    pub nats_bucket: String,
    /// How long a claimed slot's key is kept (the bucket's `max_age`); longer
    /// than any catch-up window, so a late board finds the slot taken.
    pub nats_max_age: Dur,
}

/// The shortest `takeover_after`: a broker restart or a primary's reboot is not a failover.
pub const MIN_TAKEOVER: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            name: None,
            role: FleetRole::Primary,
            primary: None,
            key_env: None,
            timeout: Dur::secs(120),
            replay_window: Dur::secs(300),
            dedup_window: Dur::secs(7 * 24 * 3600),
            nats_url: None,
            takeover_after: Dur::secs(60),
            nats_user: None,
            nats_password_env: None,
            nats_bucket: "bramble_once".into(),
            nats_max_age: Dur::secs(7 * 24 * 3600),
        }
    }
}

/// Why `[fleet]` cannot run as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetConfigError {
    #[error("[fleet] needs [mqtt] url: the boards talk over the MQTT broker")]
    NoBroker,
    #[error("[fleet] key_env is not set: name the variable holding the fleet key (`openssl rand -hex 32`)")]
    NoKeyEnv,
    #[error("[fleet] key_env names {0} but it is not set")]
    KeyUnset(String),
    #[error("[fleet] the key in {0} is too short: use at least {MIN_KEY_BYTES} characters (`openssl rand -hex 32`)")]
    KeyShort(String),
    #[error("[fleet] role = \"{0}\" needs `primary = \"<board>\"`: the board whose commands it takes")]
    NoPrimary(&'static str),
    #[error("[fleet] primary = \"{0}\" names this board itself: a node needs another board as its primary")]
    SelfPrimary(BoardName),
    #[error("[fleet] takeover_after = \"{0}\" is too short: use at least 5s (a broker restart is not a failover)")]
    TakeoverShort(String),
    #[error(
        "[fleet] nats_url `{0}`: expected nats://host[:port] (the account goes in nats_user and nats_password_env)"
    )]
    NatsUrl(String),
    #[error("[fleet] nats_bucket `{0}`: expected 1 to 64 characters from `A-Z a-z 0-9 _ -`")]
    NatsBucket(String),
    #[error("[fleet] nats_password_env names {0} but it is not set")]
    NatsPasswordUnset(String),
    #[error(
        "[mqtt] topic_prefix `{0}` differs from `bramble/<[fleet] name>`: the boards find each other under bramble/<board>; remove topic_prefix"
    )]
    Prefix(String),
    #[error(
        "[mqtt] device `{0}` differs from [fleet] name `{1}`: a board's device is its board name (its topics, its Home Assistant device); remove device"
    )]
    Device(String, BoardName),
}

impl FleetConfig {
    /// On, with this board's name.
    pub fn board(&self) -> Option<&BoardName> {
        self.name.as_ref()
    }

    /// The fleet key, checked: set and long enough.
    pub fn key(&self) -> Result<Secret, FleetConfigError> {
        let env = self.key_env.as_deref().ok_or(FleetConfigError::NoKeyEnv)?;
        let key = secret_from_env(env).ok_or_else(|| FleetConfigError::KeyUnset(env.to_string()))?;
        if key.expose().len() < MIN_KEY_BYTES {
            return Err(FleetConfigError::KeyShort(env.to_string()));
        }
        Ok(key)
    }

    /// In a fleet the board's name is its MQTT device (so its topics, last
    /// will and Home Assistant device are the board's even when every board
    /// is called `raspberrypi`): an unset `[mqtt] device` becomes the name.
    pub fn name_the_device(&self, mqtt: &mut super::MqttConfig) {
        if let Some(name) = &self.name {
            if mqtt.device.as_deref().is_none_or(|d| d.trim().is_empty()) {
                mqtt.device = Some(name.to_string());
            }
        }
    }

    /// The board a node obeys; `None` on the primary.
    pub fn primary_of_node(&self) -> Result<Option<&BoardName>, FleetConfigError> {
        match self.role {
            FleetRole::Primary => Ok(None),
            role => {
                let p = self.primary.as_ref().ok_or(FleetConfigError::NoPrimary(role.as_str()))?;
                if Some(p) == self.name.as_ref() {
                    return Err(FleetConfigError::SelfPrimary(p.clone()));
                }
                Ok(Some(p))
            }
        }
    }

    /// Everything that keeps the fleet off, given `[mqtt]`; `Ok` when off or fine.
    pub fn check(&self, mqtt: &super::MqttConfig) -> Result<(), FleetConfigError> {
        let Some(name) = &self.name else { return Ok(()) };
        if mqtt.url.is_none() {
            return Err(FleetConfigError::NoBroker);
        }
        if let Some(prefix) = mqtt.topic_prefix.as_deref() {
            if prefix.trim().trim_end_matches('/') != format!("bramble/{name}") {
                return Err(FleetConfigError::Prefix(prefix.to_string()));
            }
        }
        if let Some(device) = mqtt.device.as_deref().map(str::trim).filter(|d| *d != name.as_str()) {
            return Err(FleetConfigError::Device(device.to_string(), name.clone()));
        }
        self.primary_of_node()?;
        if self.takeover_after.get() < MIN_TAKEOVER {
            return Err(FleetConfigError::TakeoverShort(self.takeover_after.to_string()));
        }
        self.check_nats()?;
        self.key().map(|_| ())
    }

    /// `nats_url`'s shape and the bucket's name (the connection is tried at each claim).
    pub fn check_nats(&self) -> Result<(), FleetConfigError> {
        let Some(url) = &self.nats_url else { return Ok(()) };
        let rest = url.trim().strip_prefix("nats://").unwrap_or_default();
        if rest.is_empty() || rest.contains(['@', '/', '?', '#']) {
            return Err(FleetConfigError::NatsUrl(url.clone()));
        }
        let b = &self.nats_bucket;
        if b.is_empty() || b.len() > 64 || !b.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-') {
            return Err(FleetConfigError::NatsBucket(b.clone()));
        }
        self.nats_password().map(|_| ())
    }

    /// The NATS account's password (`None`: no `nats_password_env`).
    pub fn nats_password(&self) -> Result<Option<Secret>, FleetConfigError> {
        let Some(env) = self.nats_password_env.as_deref() else { return Ok(None) };
        secret_from_env(env).map(Some).ok_or_else(|| FleetConfigError::NatsPasswordUnset(env.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_names_are_checked_where_read() {
        assert_eq!("garage".parse::<BoardName>().unwrap().as_str(), "garage");
        for bad in ["", "Garage", "a/b", "a+", "#", "x".repeat(33).as_str(), "caf\u{e9}"] {
            assert!(matches!(bad.parse::<BoardName>(), Err(BoardNameError::Invalid(_))), "{bad}");
        }
        assert_eq!("any".parse::<BoardName>(), Err(BoardNameError::Any));
    }

    #[cfg(feature = "fleet")]
    fn parse(text: &str) -> crate::config::Config {
        crate::config::Config::parse(text, "c.toml".as_ref()).unwrap()
    }

    #[test]
    #[cfg(feature = "fleet")]
    fn a_board_s_device_is_its_board_name_not_its_host_name() {
        let c = parse("[mqtt]\nurl = \"mqtt://127.0.0.1\"\n[fleet]\nname = \"garage\"\nkey_env = \"K\"\n");
        let s = crate::clients::mqtt::Settings::from_config(&c.mqtt).unwrap().unwrap();
        assert_eq!((s.device.as_str(), s.prefix.as_str()), ("garage", "bramble/garage"));
        let c = parse("[mqtt]\nurl = \"mqtt://127.0.0.1\"\ndevice = \"raspberrypi\"\n[fleet]\nname = \"garage\"\n");
        assert!(matches!(c.fleet.check(&c.mqtt), Err(FleetConfigError::Device(d, _)) if d == "raspberrypi"));
        // Without a fleet nothing changes: the host name stays the default.
        let c = parse("[mqtt]\nurl = \"mqtt://127.0.0.1\"\n");
        assert_eq!(c.mqtt.device, None);
    }

    #[test]
    #[cfg(feature = "fleet")]
    fn off_without_a_name_and_checked_with_one() {
        let c = parse("");
        assert!(c.fleet.board().is_none());
        assert_eq!(c.fleet.check(&c.mqtt), Ok(()));
        let c = parse("[fleet]\nname = \"garage\"\nrole = \"node\"\n");
        assert_eq!(c.fleet.check(&c.mqtt), Err(FleetConfigError::NoBroker));
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"garage\"\nrole = \"node\"\n");
        assert_eq!(c.fleet.check(&c.mqtt), Err(FleetConfigError::NoPrimary("node")));
        let c =
            parse("[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"garage\"\nrole = \"node\"\nprimary = \"garage\"\n");
        assert!(matches!(c.fleet.check(&c.mqtt), Err(FleetConfigError::SelfPrimary(_))));
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\ntopic_prefix = \"x/y\"\n[fleet]\nname = \"living\"\n");
        assert!(matches!(c.fleet.check(&c.mqtt), Err(FleetConfigError::Prefix(_))));
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"living\"\n");
        assert_eq!(c.fleet.check(&c.mqtt), Err(FleetConfigError::NoKeyEnv));
        let c =
            parse("[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"living\"\nkey_env = \"BRAMBLE_TEST_NO_FLEET_KEY\"\n");
        assert!(matches!(c.fleet.check(&c.mqtt), Err(FleetConfigError::KeyUnset(_))));
        let c = parse(
            "[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"garage\"\nrole = \"standby\"\nprimary = \"living\"\ntakeover_after = \"2s\"\n",
        );
        assert!(matches!(c.fleet.check(&c.mqtt), Err(FleetConfigError::TakeoverShort(_))));
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nname = \"garage\"\nrole = \"standby\"\n");
        assert_eq!(c.fleet.check(&c.mqtt), Err(FleetConfigError::NoPrimary("standby")));
        assert_eq!(c.fleet.takeover_after.get(), std::time::Duration::from_secs(60));
        let nats = |extra: &str| {
            parse(&format!("[fleet]\nname = \"living\"\nnats_url = \"nats://n.lan:4222\"\n{extra}")).fleet.check_nats()
        };
        assert_eq!(nats(""), Ok(()));
        assert!(matches!(nats("nats_bucket = \"a.b\"\n"), Err(FleetConfigError::NatsBucket(_))));
        assert!(matches!(
            nats("nats_password_env = \"BRAMBLE_TEST_NO_NATS_PW\"\n"),
            Err(FleetConfigError::NatsPasswordUnset(_))
        ));
        let c = parse("[fleet]\nname = \"living\"\nnats_url = \"nats://u:p@n.lan\"\n");
        assert!(
            matches!(c.fleet.check_nats(), Err(FleetConfigError::NatsUrl(_))),
            "the password is not put in the URL"
        );
        let err = crate::config::Config::parse("[fleet]\nname = \"Bad Name\"\n", "c.toml".as_ref()).unwrap_err();
        assert!(err.to_string().contains("not a board name"), "{err}");
        let err = crate::config::Config::parse("[fleet]\nrole = \"boss\"\n", "c.toml".as_ref()).unwrap_err();
        assert!(err.to_string().contains("primary"), "{err}");
    }
}
