//! One connection over either MQTT version: [`Client`] (requests) and
//! [`Events`] (the event loop), each an enum over rumqttc's MQTT 5 (`v5`) and
//! MQTT 3.1.1 (`rumqttc::`) halves, and [`Event`]: the few things the link and
//! the channel act on, in the same words for both.
//!
//! What MQTT 5 gives and 3.1.1 lacks, and what stands in for it:
//!
//! | MQTT 5 | with 3.1.1 |
//! |---|---|
//! | the broker's *Maximum Packet Size* in the ConnAck: larger publishes are refused before they are sent | `[mqtt] max_packet` alone (set it to the broker's limit) |
//! | our *Maximum Packet Size* in the CONNECT: the broker drops larger messages for us | none: a larger message ends the connection (rumqttc cannot skip it); the reconnect backs off, and the log says which limit it was |
//! | PubAck reason codes (a refusal is counted by the outbox) | every PubAck is success: a 3.1.1 broker refuses by dropping the message or the connection (the latter is counted as before) |
//! | *Session Expiry* (a week) | `clean_session = false`: the broker keeps the session as long as its own config says |
//! | *Server Keep Alive* | the keep-alive we announce |
//! | *Receive Maximum* | our in-flight limit alone |

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::{mqttbytes::v4 as p4, Outgoing};

/// The MQTT version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V5,
    V311,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::V5 => "MQTT 5",
            Protocol::V311 => "MQTT 3.1.1",
        })
    }
}

/// The request side of one connection.
#[derive(Clone)]
pub enum Client {
    V5(rumqttc::v5::AsyncClient),
    V311(rumqttc::AsyncClient),
}

impl Client {
    /// Queue one QoS 1 publish; `false` when rumqttc's request queue is full.
    pub fn try_publish(&self, topic: &str, retain: bool, payload: Vec<u8>) -> bool {
        match self {
            Client::V5(c) => c.try_publish(topic, rumqttc::v5::mqttbytes::QoS::AtLeastOnce, retain, payload).is_ok(),
            Client::V311(c) => c.try_publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload).is_ok(),
        }
    }

    /// Queue a QoS 1 subscription.
    pub fn try_subscribe(&self, filter: &str) -> Result<(), String> {
        match self {
            Client::V5(c) => {
                c.try_subscribe(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce).map_err(|e| e.to_string())
            }
            Client::V311(c) => c.try_subscribe(filter, rumqttc::QoS::AtLeastOnce).map_err(|e| e.to_string()),
        }
    }

    pub fn try_disconnect(&self) {
        let _ = match self {
            Client::V5(c) => c.try_disconnect().map_err(|_| ()),
            Client::V311(c) => c.try_disconnect().map_err(|_| ()),
        };
    }
}

/// What the connection reports, in the same words for both versions.
#[derive(Debug)]
pub enum Event {
    /// Connected. `max_packet`: the broker's Maximum Packet Size (MQTT 5 only).
    ConnAck {
        session_present: bool,
        max_packet: Option<u32>,
    },
    /// Refused by the broker in its ConnAck (MQTT 5 delivers it as an event).
    Refused(String),
    /// `topic`: `None` when it is not UTF-8 (MQTT 5 carries bytes).
    Publish {
        topic: Option<String>,
        payload: Vec<u8>,
        retain: bool,
    },
    /// The broker has a publish. `refused`: an MQTT 5 reason that is not success.
    PubAck {
        pkid: u16,
        refused: Option<String>,
    },
    /// rumqttc wrote a publish with this packet id (0 for QoS 0).
    OutgoingPublish(u16),
    OutgoingDisconnect,
    Other,
}

/// Why a connection ended or never began.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}")]
pub struct Failure {
    pub text: String,
    /// The peer's answer to our CONNECT was not an MQTT 5 one: it refused the
    /// protocol version, sent what MQTT 5 cannot read, or hung up or went
    /// quiet before a ConnAck. What a 3.1.1-only broker does to MQTT 5.
    pub not_v5: bool,
    /// The broker refused us by name (credentials, client id, not authorized).
    pub refused: bool,
}

/// The event loop of one connection.
pub enum Events {
    V5(Box<rumqttc::v5::EventLoop>),
    V311(Box<rumqttc::EventLoop>),
}

impl Events {
    pub fn protocol(&self) -> Protocol {
        match self {
            Events::V5(_) => Protocol::V5,
            Events::V311(_) => Protocol::V311,
        }
    }

    /// The next event. Cancel-safe only between requests (see keepalive.rs).
    pub async fn poll(&mut self) -> Result<Event, Failure> {
        match self {
            Events::V5(e) => e.poll().await.map(event5).map_err(|e| failure5(&e)),
            Events::V311(e) => e.poll().await.map(event4).map_err(|e| failure4(&e)),
        }
    }

    /// The keep-alive in force (the announced one, or the broker's).
    pub fn keep_alive(&self) -> Duration {
        match self {
            Events::V5(e) => e.options.keep_alive(),
            Events::V311(e) => e.mqtt_options.keep_alive(),
        }
    }

    pub fn set_keep_alive(&mut self, every: Duration) {
        match self {
            Events::V5(e) => {
                e.options.set_keep_alive(every);
            }
            Events::V311(e) => {
                e.mqtt_options.set_keep_alive(every);
            }
        }
    }

    /// Put a PINGREQ first in line.
    pub fn queue_ping(&mut self) {
        match self {
            Events::V5(e) => e.pending.push_back(rumqttc::v5::Request::PingReq),
            Events::V311(e) => e.pending.push_back(rumqttc::Request::PingReq(p4::PingReq)),
        }
    }

    #[cfg(test)]
    pub fn ping_queued(&self) -> bool {
        match self {
            Events::V5(e) => matches!(e.pending.front(), Some(rumqttc::v5::Request::PingReq)),
            Events::V311(e) => matches!(e.pending.front(), Some(rumqttc::Request::PingReq(_))),
        }
    }
}

fn event5(e: rumqttc::v5::Event) -> Event {
    use rumqttc::v5::Event as E;
    match e {
        E::Incoming(p5::Packet::ConnAck(a)) => match a.code {
            p5::ConnectReturnCode::Success => Event::ConnAck {
                session_present: a.session_present,
                max_packet: a.properties.as_ref().and_then(|p| p.max_packet_size),
            },
            code => Event::Refused(format!("{code:?}")),
        },
        E::Incoming(p5::Packet::Publish(p)) => Event::Publish {
            topic: String::from_utf8(p.topic.to_vec()).ok(),
            payload: p.payload.to_vec(),
            retain: p.retain,
        },
        E::Incoming(p5::Packet::PubAck(a)) => Event::PubAck {
            pkid: a.pkid,
            refused: match a.reason {
                p5::PubAckReason::Success | p5::PubAckReason::NoMatchingSubscribers => None,
                r => Some(format!("{r:?}")),
            },
        },
        E::Outgoing(o) => outgoing(o),
        E::Incoming(_) => Event::Other,
    }
}

fn event4(e: rumqttc::Event) -> Event {
    use rumqttc::Event as E;
    match e {
        // rumqttc's 3.1.1 loop turns a refusal into an error; a ConnAck event is success.
        E::Incoming(p4::Packet::ConnAck(a)) => Event::ConnAck { session_present: a.session_present, max_packet: None },
        E::Incoming(p4::Packet::Publish(p)) => {
            Event::Publish { topic: Some(p.topic), payload: p.payload.to_vec(), retain: p.retain }
        }
        E::Incoming(p4::Packet::PubAck(a)) => Event::PubAck { pkid: a.pkid, refused: None },
        E::Outgoing(o) => outgoing(o),
        E::Incoming(_) => Event::Other,
    }
}

fn outgoing(o: Outgoing) -> Event {
    match o {
        Outgoing::Publish(pkid) => Event::OutgoingPublish(pkid),
        Outgoing::Disconnect => Event::OutgoingDisconnect,
        _ => Event::Other,
    }
}

/// An I/O error that means the peer hung up or spoke nonsense (not that
/// nobody listens, nor that the network is down).
fn hung_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::InvalidData)
}

fn failure5(e: &rumqttc::v5::ConnectionError) -> Failure {
    use p5::ConnectReturnCode as C;
    use rumqttc::v5::ConnectionError as E;
    use rumqttc::v5::StateError as S;
    let not_v5 = match e {
        E::ConnectionRefused(C::RefusedProtocolVersion | C::UnsupportedProtocolVersion) => true,
        E::MqttState(S::ConnectionAborted | S::Deserialization(_)) | E::NotConnAck(_) | E::Timeout(_) => true,
        E::MqttState(S::Io(io)) | E::Io(io) => hung_up(io),
        _ => false,
    };
    let refused = matches!(e, E::ConnectionRefused(_)) && !not_v5;
    Failure { text: e.to_string(), not_v5, refused }
}

fn failure4(e: &rumqttc::ConnectionError) -> Failure {
    use rumqttc::ConnectionError as E;
    let refused = matches!(e, E::ConnectionRefused(c) if *c != p4::ConnectReturnCode::RefusedProtocolVersion);
    Failure { text: e.to_string(), not_v5: false, refused }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_3_1_1_broker_does_to_mqtt_5_is_told_apart_from_a_dead_or_refusing_one() {
        use rumqttc::v5::ConnectionError as E;
        use std::io::{Error, ErrorKind as K};
        let not_v5 = |e: E| failure5(&e).not_v5;
        assert!(not_v5(E::ConnectionRefused(p5::ConnectReturnCode::UnsupportedProtocolVersion)));
        assert!(not_v5(E::MqttState(rumqttc::v5::StateError::ConnectionAborted)), "aedes: a 3.1.1 ConnAck read as v5");
        assert!(not_v5(E::Io(Error::from(K::ConnectionReset))));
        // Nobody listening, or a broker that speaks 5 and says no: not a version problem.
        assert!(!not_v5(E::Io(Error::from(K::ConnectionRefused))));
        let bad_password = failure5(&E::ConnectionRefused(p5::ConnectReturnCode::BadUserNamePassword));
        assert!(!bad_password.not_v5 && bad_password.refused);
    }
}
