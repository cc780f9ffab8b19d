//! The MQTT protocol client: who we are on the broker ([`Settings`], from
//! `[mqtt]`), the [`Link`] everything that publishes shares (ack tracking, the
//! retained state re-published on every connect), the keep-alive on a kernel
//! timer, and `bramble doctor`'s probe. Services-level: the MQTT channel
//! (`crate::channels::mqtt`, which runs the connection task, routes what comes
//! in and implements delivery) and the `mqtt_publish` tool both sit above it.

mod keepalive;
mod link;

pub use keepalive::Pinger;
pub use link::{Link, PublishError};

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::LastWill;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use rumqttc::Transport;

use crate::config::MqttConfig;
use crate::util::mqtt::InputTopics;

/// Home Assistant's default discovery prefix.
pub const DISCOVERY_PREFIX: &str = "homeassistant";

/// `[mqtt] turns_per_minute` and `turn_burst`; `per_minute = 0`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnRate {
    pub per_minute: u32,
    pub burst: u32,
}
/// Largest packet sent (rumqttc's default is 10 KiB; an LLM answer is bigger).
pub const MAX_PACKET: usize = 1024 * 1024;
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
    /// `[mqtt] inbound`: `<prefix>/in` and `<prefix>/run/<job>` are listened to.
    pub inbound: bool,
    /// `[mqtt] keep_alive`: the PINGREQ interval, which the broker's last will waits 1.5 × on.
    pub keep_alive: Duration,
    /// What we subscribe to, route by, and never publish to.
    pub inputs: InputTopics,
    /// `[mqtt] turns_per_minute` and `turn_burst`: model turns one source may start.
    pub turn_rate: TurnRate,
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
        let mut s = Settings {
            client_id: device.clone(),
            device,
            prefix,
            host: url.host.clone(),
            port: url.port,
            tls: url.tls,
            username: c.username.clone(),
            password,
            discovery: c.discovery,
            inbound: c.inbound,
            keep_alive: c.keep_alive.get(),
            inputs: InputTopics::default(),
            turn_rate: TurnRate { per_minute: c.turns_per_minute, burst: c.turn_burst },
        };
        s.inputs = InputTopics {
            prefix: s.prefix.clone(),
            inbound: s.inbound,
            discovery: s.discovery.then(|| s.discovery_filter()),
            triggers: c.trigger.iter().map(|t| t.topic.clone()).collect(),
        };
        Ok(Some(s))
    }

    /// The device name as a Home Assistant discovery node id: `[a-zA-Z0-9_-]` only.
    pub fn node_id(&self) -> String {
        let clean: String = self
            .device
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect();
        format!("bramble_{clean}")
    }

    /// The filter matching every discovery document of this device.
    pub fn discovery_filter(&self) -> String {
        format!("{DISCOVERY_PREFIX}/+/{}/+/config", self.node_id())
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

    /// The rumqttc options: MQTT 5, persistent session, last will, packet limit.
    pub fn options(&self) -> Result<MqttOptions, MqttError> {
        let mut o = self.connection(self.client_id.clone())?;
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(SESSION_EXPIRY))
            .set_outgoing_inflight_upper_limit(MAX_INFLIGHT)
            .set_last_will(LastWill::new(self.topic("status"), "offline", QoS::AtLeastOnce, true, None));
        Ok(o)
    }

    /// Broker, credentials, TLS and limits under `client_id`: what every connection shares.
    fn connection(&self, client_id: String) -> Result<MqttOptions, MqttError> {
        let mut o = MqttOptions::new(client_id, self.host.clone(), self.port);
        o.set_keep_alive(self.keep_alive)
            .set_max_packet_size(Some(MAX_INCOMING as u32))
            .set_network_options(network_options());
        if let Some(user) = &self.username {
            o.set_credentials(user.clone(), self.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default());
        }
        if self.tls {
            use rustls_platform_verifier::ConfigVerifierExt as _;
            // Roots and checks from the system, like reqwest; crypto from the
            // process-wide ring provider (`crate::install_crypto`).
            let tls = rustls::ClientConfig::with_platform_verifier().map_err(|e| MqttError::Tls(e.to_string()))?;
            o.set_transport(Transport::tls_with_config(tls.into()));
        }
        Ok(o)
    }
}

/// `bramble doctor`: a real MQTT CONNECT with the configured credentials and
/// TLS, under a client id of its own (`<device>-doctor`, clean start, no will),
/// so the daemon's session is neither taken over nor marked offline. `Ok`
/// with what answered, `Err` with why not; `Ok(None)` when MQTT is not configured.
pub async fn probe(c: &MqttConfig, limit: Duration) -> Result<Option<String>, String> {
    let s = match Settings::from_config(c) {
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.to_string()),
        Ok(Some(s)) => s,
    };
    let mut o = s.connection(format!("{}-doctor", s.client_id)).map_err(|e| e.to_string())?;
    o.set_clean_start(true);
    let (client, mut events) = AsyncClient::new(o, 4);
    let connected = tokio::time::timeout(limit, async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::ConnAck(ack))) => {
                    return match ack.code {
                        rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success => Ok(()),
                        code => Err(format!("the broker refused the connection: {code:?}")),
                    };
                }
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err(format!("no answer from the broker within {} s", limit.as_secs())));
    let _ = client.try_disconnect();
    connected.map(|()| {
        Some(format!(
            "connected to {} as {}-doctor ({})",
            s.describe(),
            s.client_id,
            if s.tls { "TLS" } else { "plain" }
        ))
    })
}

/// TCP options: no Nagle delay (a small PUBLISH or PUBACK would otherwise wait
/// for the peer's delayed ACK, about 40 ms per exchange), and a connect timeout.
pub fn network_options() -> rumqttc::NetworkOptions {
    let mut n = rumqttc::NetworkOptions::new();
    n.set_tcp_nodelay(true);
    n.set_connection_timeout(10);
    n
}
