//! The MQTT protocol client: who we are on the broker ([`Settings`], from
//! `[mqtt]`), the [`Link`] everything that publishes shares (ack tracking, the
//! retained state re-published on every connect), the keep-alive on a kernel
//! timer, and `bramble doctor`'s probe. Services-level: the MQTT channel
//! (`crate::channels::mqtt`, which runs the connection task, routes what comes
//! in and implements delivery) and the `mqtt_publish` tool both sit above it.

//!
//! Both MQTT versions, over one [`wire::Client`] / [`wire::Events`] pair:
//! `[mqtt] protocol = "auto"` tries 5 and, for a broker that answers an MQTT 5
//! CONNECT as a 3.1.1 one does (refuses the version, sends a 3.1.1 ConnAck,
//! hangs up), speaks 3.1.1 until the daemon restarts (see [`wire`] for what
//! stands in for what 5 gives).

mod keepalive;
mod link;
pub mod wire;

pub use keepalive::Pinger;
pub use link::{Link, PublishError};
pub use wire::{Client, Event, Events, Failure, Protocol};

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::LastWill;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::MqttOptions;
use rumqttc::Transport;

use crate::config::{MqttConfig, MqttProtocol};
use crate::util::mqtt::InputTopics;

/// Home Assistant's default discovery prefix.
pub const DISCOVERY_PREFIX: &str = "homeassistant";

/// `[mqtt] turns_per_minute` and `turn_burst`; `per_minute = 0`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnRate {
    pub per_minute: u32,
    pub burst: u32,
}
/// Largest packet sent by default (`[mqtt] max_packet`; rumqttc's default is 10 KiB; an LLM answer is bigger).
pub const MAX_PACKET: usize = crate::config::MQTT_MAX_PACKET as usize;
/// `[mqtt] max_packet`'s range: room for a record, and MQTT's own limit (256 MiB).
const MAX_PACKET_RANGE: std::ops::RangeInclusive<u32> = 1024..=268_435_455;
/// Largest packet accepted, told to the broker in CONNECT (MQTT 5 Maximum
/// Packet Size): it drops bigger messages for us. Generous: a camera snapshot fits.
pub const MAX_INCOMING: usize = 8 * 1024 * 1024;
/// How long the broker keeps our session (subscriptions, queued QoS 1
/// messages) after a disconnect, in seconds: a week of being unplugged.
pub const SESSION_EXPIRY: u32 = 7 * 24 * 3600;
/// Requests rumqttc may hold before `try_publish` says "full".
pub const REQUEST_QUEUE: usize = 64;
/// QoS 1 publishes awaiting their PUBACK at once. rumqttc's MQTT 5 event loop
/// otherwise sizes its in-flight table for 65,535 (a `Vec` of that many
/// publishes, filled at connect: 13.8 MB of RSS for nothing); the broker's
/// `Receive Maximum` can only lower this. Reports go out one at a time, and a
/// discovery burst waits in the request queue.
const MAX_INFLIGHT: u16 = 32;
/// How long a delivery waits for the broker's PubAck.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(20);
/// The keep-alives MQTT can say (seconds in a u16; rumqttc refuses less than 5 s).
const KEEP_ALIVE_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(5)..=Duration::from_secs(65535);

/// Why MQTT cannot be set up from the config.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("[mqtt] topic_prefix `{0}` must be a topic: not empty, no `+`, `#` or control characters, not starting with `$`")]
    Prefix(String),
    #[error("[mqtt] password_env names {0} but it is not set")]
    PasswordEnv(String),
    #[error("MQTT over TLS: cannot use the system's certificates: {0}")]
    Tls(String),
    #[error("[mqtt] keep_alive `{0}` must be between 5s and 65535s")]
    KeepAlive(crate::config::Dur),
    #[error("[mqtt] max_packet {0} must be between 1024 and 268435455 (bytes)")]
    MaxPacket(u32),
}

/// A device name as a discovery node id ([`Settings::node_id`]): also how a
/// fleet node names its primary's device (the primary's device is its board name).
pub fn node_id_of(device: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if device.chars().all(plain) {
        return format!("bramble_{device}");
    }
    let clean: String = device.chars().take(48).map(|c| if plain(c) { c } else { '_' }).collect();
    // FNV-1a, 32 bits: stable across builds and platforms (std's hasher is not).
    let hash = device.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    format!("bramble_{clean}_{hash:08x}")
}

/// `[mqtt]`, resolved: who we are on the broker and where our topics are.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The device name (client id, discovery node).
    pub device: String,
    /// Topic prefix, `bramble/<device>` by default, without a trailing `/`.
    pub prefix: String,
    pub client_id: String,
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub username: Option<String>,
    password: Option<crate::config::Secret>,
    pub discovery: bool,
    /// The discovery node id of the device this one is reached through (a
    /// fleet node's primary: Home Assistant's `via_device`), if any.
    pub via: Option<String>,
    /// `[mqtt] inbound`: `<prefix>/in` and `<prefix>/run/<job>` are listened to.
    pub inbound: bool,
    /// `[mqtt] keep_alive`: the PINGREQ interval, which the broker's last will waits 1.5 × on.
    pub keep_alive: Duration,
    /// What we subscribe to, route by, and never publish to.
    pub inputs: InputTopics,
    /// `[mqtt] turns_per_minute` and `turn_burst`: model turns one source may start.
    pub turn_rate: TurnRate,
    /// `[mqtt] protocol`.
    pub protocol: MqttProtocol,
    /// `[mqtt] max_packet`: the largest packet we send.
    pub max_packet: usize,
}

impl Settings {
    /// `Ok(None)` when no broker is configured.
    pub fn from_config(c: &MqttConfig) -> Result<Option<Settings>, MqttError> {
        let Some(url) = &c.url else { return Ok(None) };
        let device = c
            .device
            .clone()
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(crate::util::sys::hostname)
            .trim()
            .to_string();
        let device = if device.is_empty() { "bramble".to_string() } else { device };
        let prefix = c
            .topic_prefix
            .clone()
            .unwrap_or_else(|| format!("bramble/{device}"))
            .trim()
            .trim_end_matches('/')
            .to_string();
        if crate::util::mqtt::check_topic(&prefix).is_err() {
            return Err(MqttError::Prefix(prefix));
        }
        let password = match (&c.password, &c.password_env) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(env)) => {
                Some(crate::config::secret_from_env(env).ok_or_else(|| MqttError::PasswordEnv(env.clone()))?)
            }
            (None, None) => None,
        };
        if !KEEP_ALIVE_RANGE.contains(&c.keep_alive.get()) {
            return Err(MqttError::KeepAlive(c.keep_alive));
        }
        if !MAX_PACKET_RANGE.contains(&c.max_packet) {
            return Err(MqttError::MaxPacket(c.max_packet));
        }
        let mut s = Settings {
            protocol: c.protocol,
            max_packet: c.max_packet as usize,
            client_id: device.clone(),
            device,
            prefix,
            host: url.host.clone(),
            port: url.port,
            tls: url.tls,
            username: c.username.clone(),
            password,
            discovery: c.discovery,
            via: None,
            inbound: c.inbound,
            keep_alive: c.keep_alive.get(),
            inputs: InputTopics::default(),
            turn_rate: TurnRate { per_minute: c.turns_per_minute, burst: c.turn_burst },
        };
        s.inputs = InputTopics {
            prefix: s.prefix.clone(),
            inbound: s.inbound,
            discovery: if s.discovery { s.discovery_filters() } else { Vec::new() },
            triggers: c.trigger.iter().map(|t| t.topic.clone()).collect(),
            fleet: Vec::new(),
        };
        Ok(Some(s))
    }

    /// The device as a Home Assistant discovery node id (`[a-zA-Z0-9_-]`
    /// only), also the prefix of every unique id. A name made only of those
    /// characters is used as it is (`bramble_garden_pi`: what every version
    /// has published, so existing entities stay). Any other name once had its
    /// other characters replaced by `_`, so `garden pi` and `garden_pi` shared
    /// a node and each one's clean-up deleted the other's entities; it now
    /// gets at most 48 of those characters and a hash of the whole name
    /// (`bramble_garden_pi_4be4c2a1`): distinct names, distinct nodes, the same
    /// node on every start and on every board with that name.
    pub fn node_id(&self) -> String {
        node_id_of(&self.device)
    }

    /// The filter matching every discovery document of this device.
    pub fn discovery_filter(&self) -> String {
        format!("{DISCOVERY_PREFIX}/+/{}/+/config", self.node_id())
    }

    /// What discovery clean-up listens to: our node, and the node an earlier
    /// version gave this name if that differs (its documents that name our
    /// topics are deleted once: the upgrade's migration; see `node_id`).
    pub fn discovery_filters(&self) -> Vec<String> {
        let legacy: String = self
            .device
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect();
        let legacy = format!("{DISCOVERY_PREFIX}/+/bramble_{legacy}/+/config");
        let own = self.discovery_filter();
        if legacy == own {
            vec![own]
        } else {
            vec![own, legacy]
        }
    }

    /// `<prefix>/<rest>`.
    pub fn topic(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    /// `host:port` and whether TLS is used, for status lines.
    pub fn describe(&self) -> String {
        format!(
            "{}://{}:{} as `{}`, topics {}/…",
            if self.tls { "mqtts" } else { "mqtt" },
            self.host,
            self.port,
            self.client_id,
            self.prefix
        )
    }

    /// The version to try first: 5 unless `[mqtt] protocol = "3.1.1"`.
    pub fn first_protocol(&self) -> Protocol {
        match self.protocol {
            MqttProtocol::V311 => Protocol::V311,
            MqttProtocol::Auto | MqttProtocol::V5 => Protocol::V5,
        }
    }

    /// A fresh client and event loop speaking `protocol`: the daemon's
    /// persistent session with its last will, or (`doctor`) a clean one under
    /// `<client id>-doctor` without a will.
    pub fn open(&self, protocol: Protocol, doctor: bool) -> Result<(Client, Events), MqttError> {
        let id = if doctor { format!("{}-doctor", self.client_id) } else { self.client_id.clone() };
        match protocol {
            Protocol::V5 => {
                let o = self.options5(id, doctor)?;
                let (c, e) = rumqttc::v5::AsyncClient::new(o, REQUEST_QUEUE);
                Ok((Client::V5(c), Events::V5(Box::new(e))))
            }
            Protocol::V311 => {
                let mut o = rumqttc::MqttOptions::new(id, self.host.clone(), self.port);
                // Our limit for what comes in cannot be told to a 3.1.1 broker (wire.rs).
                o.set_keep_alive(self.keep_alive)
                    .set_max_packet_size(MAX_INCOMING, self.max_packet.max(MAX_INCOMING))
                    .set_inflight(MAX_INFLIGHT)
                    .set_clean_session(doctor);
                if !doctor {
                    o.set_last_will(rumqttc::LastWill::new(
                        self.topic("status"),
                        "offline",
                        rumqttc::QoS::AtLeastOnce,
                        true,
                    ));
                }
                if let Some(user) = &self.username {
                    o.set_credentials(user.clone(), self.password_text());
                }
                if let Some(t) = self.transport()? {
                    o.set_transport(t);
                }
                let (c, mut e) = rumqttc::AsyncClient::new(o, REQUEST_QUEUE);
                e.set_network_options(network_options());
                Ok((Client::V311(c), Events::V311(Box::new(e))))
            }
        }
    }

    /// The daemon's MQTT 5 options: persistent session, last will, packet limit.
    pub fn options(&self) -> Result<MqttOptions, MqttError> {
        self.options5(self.client_id.clone(), false)
    }

    fn options5(&self, client_id: String, doctor: bool) -> Result<MqttOptions, MqttError> {
        let mut o = MqttOptions::new(client_id, self.host.clone(), self.port);
        o.set_keep_alive(self.keep_alive)
            .set_max_packet_size(Some(MAX_INCOMING as u32))
            .set_network_options(network_options())
            .set_clean_start(doctor)
            .set_outgoing_inflight_upper_limit(MAX_INFLIGHT);
        if !doctor {
            o.set_session_expiry_interval(Some(SESSION_EXPIRY)).set_last_will(LastWill::new(
                self.topic("status"),
                "offline",
                QoS::AtLeastOnce,
                true,
                None,
            ));
        }
        if let Some(user) = &self.username {
            o.set_credentials(user.clone(), self.password_text());
        }
        if let Some(t) = self.transport()? {
            o.set_transport(t);
        }
        Ok(o)
    }

    fn password_text(&self) -> String {
        self.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default()
    }

    /// TLS with the system's roots, like reqwest; crypto from the process-wide
    /// ring provider (`crate::install_crypto`). `None`: plain TCP.
    fn transport(&self) -> Result<Option<Transport>, MqttError> {
        if !self.tls {
            return Ok(None);
        }
        use rustls_platform_verifier::ConfigVerifierExt as _;
        let tls = rustls::ClientConfig::with_platform_verifier().map_err(|e| MqttError::Tls(e.to_string()))?;
        Ok(Some(Transport::tls_with_config(tls.into())))
    }
}

/// `bramble doctor`: a real MQTT CONNECT with the configured credentials and
/// TLS, under a client id of its own (`<device>-doctor`, clean start, no will),
/// so the daemon's session is neither taken over nor marked offline. `Ok`
/// with what answered (and in which MQTT version), `Err` with why not;
/// `Ok(None)` when MQTT is not configured. A broker that does not answer
/// MQTT 5 is asked again in 3.1.1, so a 3.1.1-only broker is named as such
/// (never blamed on the URL or the password).
pub async fn probe(c: &MqttConfig, limit: Duration) -> Result<Option<String>, String> {
    let s = match Settings::from_config(c) {
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.to_string()),
        Ok(Some(s)) => s,
    };
    let first = s.first_protocol();
    let said = |p: Protocol, why: &str| {
        Some(format!(
            "connected to {} as {}-doctor ({p}{why}, {})",
            s.describe(),
            s.client_id,
            if s.tls { "TLS" } else { "plain" }
        ))
    };
    let v5_failure = match connect_once(&s, first, limit).await {
        Ok(()) => return Ok(said(first, "")),
        Err(f) if first == Protocol::V5 && f.not_v5 => f,
        Err(f) => return Err(advice(&f)),
    };
    match (connect_once(&s, Protocol::V311, limit).await, s.protocol) {
        (Ok(()), MqttProtocol::Auto) => Ok(said(Protocol::V311, ": the broker does not speak MQTT 5")),
        (Ok(()), _) => Err(format!(
            "the broker speaks only MQTT 3.1.1 (to MQTT 5 it answered: {}), and [mqtt] protocol = \"5\": \
             set protocol = \"auto\" or \"3.1.1\"",
            v5_failure.text
        )),
        (Err(f4), _) => Err(format!("{} (asked again in MQTT 3.1.1: {})", advice(&v5_failure), f4.text)),
    }
}

/// A failed CONNECT and what to check for it.
fn advice(f: &Failure) -> String {
    if f.refused {
        format!("{}: check [mqtt] username and password_env (and the broker's ACL for this client id)", f.text)
    } else {
        format!("{}: check [mqtt] url (is a broker listening there?)", f.text)
    }
}

/// One CONNECT in `protocol` (doctor's client id): Ok at a successful ConnAck.
async fn connect_once(s: &Settings, protocol: Protocol, limit: Duration) -> Result<(), Failure> {
    let (client, mut events) =
        s.open(protocol, true).map_err(|e| Failure { text: e.to_string(), not_v5: false, refused: false })?;
    let outcome = tokio::time::timeout(limit, async {
        loop {
            match events.poll().await {
                Ok(Event::ConnAck { .. }) => return Ok(()),
                Ok(Event::Refused(code)) => {
                    return Err(Failure {
                        text: format!("the broker refused the connection: {code}"),
                        not_v5: false,
                        refused: true,
                    })
                }
                Ok(_) => {}
                Err(f) => return Err(f),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        Err(Failure {
            text: format!("no answer from the broker within {} s", limit.as_secs()),
            not_v5: true,
            refused: false,
        })
    });
    client.try_disconnect();
    outcome
}

/// TCP options: no Nagle delay (a small PUBLISH or PUBACK would otherwise wait
/// for the peer's delayed ACK, about 40 ms per exchange), and a connect timeout.
pub fn network_options() -> rumqttc::NetworkOptions {
    let mut n = rumqttc::NetworkOptions::new();
    n.set_tcp_nodelay(true);
    n.set_connection_timeout(10);
    n
}
