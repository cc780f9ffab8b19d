//! [`Link`]: the publishing side of the MQTT connection, and how a publish
//! learns that the broker has it (see the parent module's docs on ack tracking).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::wire::{Client, Protocol};
use super::Settings;

/// Why one publish did not reach the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("not connected to the MQTT broker")]
    NotConnected,
    #[error("the MQTT request queue is full")]
    QueueFull,
    #[error(
        "the payload ({0} bytes) is larger than the MQTT packet limit ([mqtt] max_packet, or the broker's Maximum Packet Size)"
    )]
    TooLarge(usize),
    #[error("the connection to the broker was lost before it acknowledged the message")]
    Lost,
    #[error("the broker did not acknowledge the message within {0:?}")]
    Timeout(Duration),
    #[error("the broker refused the message ({0})")]
    Refused(String),
}

/// The publishing side, shared by the channel, the job observer, discovery and
/// the `mqtt_publish` tool. See the module docs for how acks are tracked.
pub struct Link {
    pub settings: Settings,
    state: Mutex<LinkState>,
}

/// Told how a publish ended: acknowledged, or refused with the broker's reason.
type Waiter = oneshot::Sender<Result<(), String>>;

#[derive(Default)]
struct LinkState {
    /// The client of the current connection; `None` while disconnected.
    client: Option<Client>,
    /// Waiters of publishes handed to rumqttc and not yet written, in order.
    queued: VecDeque<Waiter>,
    /// Waiters of publishes written, by packet id, until the PubAck.
    unacked: HashMap<u16, Waiter>,
    /// Retained state published again on every ConnAck (status, discovery,
    /// job records). An empty payload clears a retained topic.
    retained: BTreeMap<String, Vec<u8>>,
    /// Retained topics not yet handed to rumqttc on this connection (its
    /// request queue was full): sent as the queue drains.
    unsent: BTreeSet<String>,
    /// The broker's Maximum Packet Size (MQTT 5 CONNACK). rumqttc fails the
    /// whole connection on a larger publish, so none is handed to it.
    broker_max: Option<u32>,
    /// The version the current (or last) connection speaks.
    protocol: Option<Protocol>,
}

impl Link {
    pub fn new(settings: Settings) -> Arc<Link> {
        Arc::new(Link { settings, state: Mutex::new(LinkState::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection's client, if connected.
    pub fn client(&self) -> Option<Client> {
        self.lock().client.clone()
    }

    /// Every publish handed to rumqttc has been written to the socket: the
    /// connection task may drop a `poll()` future to queue a ping.
    pub fn idle(&self) -> bool {
        self.lock().queued.is_empty()
    }

    pub fn connected(&self) -> bool {
        self.lock().client.is_some()
    }

    /// The MQTT version of the current (or last) connection; `None` before the first.
    pub fn protocol(&self) -> Option<Protocol> {
        self.lock().protocol
    }

    /// Hand one QoS 1 publish to rumqttc; the receiver resolves on its PubAck
    /// and fails if the connection is lost first.
    pub fn publish(
        &self,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
    ) -> Result<oneshot::Receiver<Result<(), String>>, PublishError> {
        let mut st = self.lock();
        publish_locked(self.settings.max_packet, &mut st, topic, payload, retain)
    }

    /// Publish and wait for the broker's acknowledgement.
    pub async fn publish_acked(
        &self,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
        limit: Duration,
    ) -> Result<(), PublishError> {
        let rx = self.publish(topic, payload, retain)?;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(reason))) => Err(PublishError::Refused(reason)),
            Ok(Err(_)) => Err(PublishError::Lost),
            Err(_) => Err(PublishError::Timeout(limit)),
        }
    }

    /// Set a retained topic: published now if connected, and again after every
    /// reconnect. An empty payload deletes the retained message.
    pub fn set_retained(&self, topic: &str, payload: Vec<u8>) {
        let mut st = self.lock();
        if st.retained.get(topic) == Some(&payload) {
            return;
        }
        st.retained.insert(topic.to_string(), payload);
        st.unsent.insert(topic.to_string());
        flush_retained(self.settings.max_packet, &mut st);
    }

    #[doc(hidden)]
    pub fn unsent_count(&self) -> usize {
        self.lock().unsent.len()
    }

    /// The retained topics we currently hold (for discovery clean-up).
    pub fn retained_value(&self, topic: &str) -> Option<Vec<u8>> {
        self.lock().retained.get(topic).cloned()
    }

    /// A new connection: take its client, subscribe, publish the retained state.
    /// `broker_max`: the broker's Maximum Packet Size, if it told one.
    pub fn on_connack(&self, client: Client, subscriptions: &[String], broker_max: Option<u32>) {
        let mut st = self.lock();
        st.broker_max = broker_max;
        st.protocol = Some(match client {
            Client::V5(_) => Protocol::V5,
            Client::V311(_) => Protocol::V311,
        });
        for filter in subscriptions {
            if let Err(e) = client.try_subscribe(filter) {
                tracing::warn!(filter, "cannot subscribe: {e}");
            }
        }
        st.client = Some(client);
        // `online` first, then the rest of the retained state.
        let status = self.settings.topic("status");
        st.retained.insert(status.clone(), b"online".to_vec());
        st.unsent = st.retained.keys().filter(|t| **t != status).cloned().collect();
        if let Err(e) = publish_locked(self.settings.max_packet, &mut st, &status, b"online".to_vec(), true) {
            tracing::warn!("`online` not published: {e}");
            st.unsent.insert(status);
        }
        flush_retained(self.settings.max_packet, &mut st);
    }

    /// rumqttc wrote a publish: the oldest waiter belongs to it.
    pub fn on_outgoing_publish(&self, pkid: u16) {
        let mut st = self.lock();
        if let Some(waiter) = st.queued.pop_front() {
            if pkid == 0 {
                let _ = waiter.send(Ok(()));
            } else {
                st.unacked.insert(pkid, waiter);
            }
        }
        // A request left rumqttc's queue: room for retained state that waited.
        flush_retained(self.settings.max_packet, &mut st);
    }

    /// The broker's PubAck. MQTT 5 gives a reason: a refusal (not authorized,
    /// quota exceeded, …) fails the waiter with it; the outbox counts it.
    pub fn on_puback(&self, pkid: u16, refused: Option<String>) {
        let Some(waiter) = self.lock().unacked.remove(&pkid) else { return };
        let outcome = match refused {
            None => Ok(()),
            Some(reason) => {
                tracing::warn!(reason, "the MQTT broker refused a message");
                Err(reason)
            }
        };
        let _ = waiter.send(outcome);
    }

    /// The connection is gone: every waiter fails (the outbox retries), new
    /// publishes are refused until the next ConnAck.
    pub fn on_disconnect(&self) {
        let mut st = self.lock();
        st.client = None;
        st.queued.clear();
        st.unacked.clear();
    }
}

/// Hand waiting retained state to rumqttc until its queue is full.
fn flush_retained(max_packet: usize, st: &mut LinkState) {
    while st.client.is_some() {
        let Some(topic) = st.unsent.first().cloned() else { return };
        let Some(payload) = st.retained.get(&topic).cloned() else {
            st.unsent.remove(&topic);
            continue;
        };
        match publish_locked(max_packet, st, &topic, payload, true) {
            Ok(_) => {}
            // Never sendable on this connection: skipped, not waited for.
            Err(e @ PublishError::TooLarge(_)) => tracing::warn!(topic, "retained state not published: {e}"),
            Err(_) => return,
        }
        st.unsent.remove(&topic);
    }
}

fn publish_locked(
    max_packet: usize,
    st: &mut LinkState,
    topic: &str,
    payload: Vec<u8>,
    retain: bool,
) -> Result<oneshot::Receiver<Result<(), String>>, PublishError> {
    // Fixed header, topic length, packet id and properties fit in 16 bytes.
    let size = payload.len() + topic.len() + 16;
    if size > max_packet || st.broker_max.is_some_and(|max| size > max as usize) {
        return Err(PublishError::TooLarge(payload.len()));
    }
    let client = st.client.as_ref().ok_or(PublishError::NotConnected)?;
    if !client.try_publish(topic, retain, payload) {
        return Err(PublishError::QueueFull);
    }
    let (tx, rx) = oneshot::channel();
    st.queued.push_back(tx);
    Ok(rx)
}
