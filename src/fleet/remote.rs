//! The command line's side of the fleet (`bramble cron add --on`, `cron list
//! --fleet`, `fleet status`): a short MQTT session of its own, on the board's
//! broker account under a client id of its own (clean, no will: the daemon's
//! session and presence are left alone), that reads the retained presence or
//! sends one signed command and waits for the node's signed reply.

use std::time::Duration;

use super::auth::{Guard, Signer};
use super::presence::Boards;
use super::{topics, wire, FleetError};
use crate::clients::mqtt::{Event, Settings};
use crate::config::fleet::BoardName;
use crate::config::Config;

/// How long the retained presence may take to arrive after the last message.
const QUIET: Duration = Duration::from_millis(700);

/// This board's name and the broker settings, for a command-line session.
fn session(c: &Config) -> Result<(BoardName, Settings), FleetError> {
    let me = c.fleet.board().cloned().ok_or(FleetError::Off)?;
    c.fleet.check(&c.mqtt).map_err(FleetError::Config)?;
    let mut s = Settings::from_config(&c.mqtt)
        .map_err(|e| FleetError::Broker(e.to_string()))?
        .ok_or(FleetError::Config(crate::config::fleet::FleetConfigError::NoBroker))?;
    s.client_id = format!("{}-fleet{}", s.client_id, std::process::id());
    Ok((me, s))
}

/// Every board's retained status and presence, as the broker has them now.
pub async fn snapshot(c: &Config) -> Result<(BoardName, Boards), FleetError> {
    let (me, s) = session(c)?;
    let (client, mut events) = s.open(s.first_protocol(), true).map_err(|e| FleetError::Broker(e.to_string()))?;
    let mut boards = Boards::default();
    let limit = c.fleet.timeout.get().min(Duration::from_secs(15));
    let now = jiff::Timestamp::now().as_second();
    let mut connected = false;
    loop {
        let wait = if connected { QUIET } else { limit };
        let ev = match tokio::time::timeout(wait, events.poll()).await {
            Err(_) if connected => break,
            Err(_) => return Err(FleetError::Broker(format!("no answer from the broker within {} s", wait.as_secs()))),
            Ok(Err(f)) => return Err(FleetError::Broker(f.text)),
            Ok(Ok(ev)) => ev,
        };
        match ev {
            Event::ConnAck { .. } => {
                connected = true;
                for f in [format!("{}/+/status", topics::ROOT), format!("{}/+/fleet/board", topics::ROOT)] {
                    client.try_subscribe(&f).map_err(FleetError::Broker)?;
                }
            }
            Event::Refused(why) => return Err(FleetError::Broker(format!("the broker refused the connection: {why}"))),
            Event::Publish { topic: Some(topic), payload, .. } => match topics::parse(&topic) {
                Some(topics::FleetTopic::Status(b)) => boards.status(&b, &payload, now),
                Some(topics::FleetTopic::Presence(b)) => {
                    let _ = boards.presence(&b, &payload);
                }
                _ => {}
            },
            _ => {}
        }
    }
    client.try_disconnect();
    Ok((me, boards))
}

/// Send one signed command to `node` and wait for its reply.
pub async fn command(c: &Config, node: &BoardName, kind: &str, body: String) -> Result<wire::Reply, FleetError> {
    let (me, s) = session(c)?;
    if c.fleet.role != crate::config::fleet::FleetRole::Primary {
        return Err(FleetError::NotPrimary(me));
    }
    if node == &me {
        return Err(FleetError::SelfBoard(me));
    }
    let key = c.fleet.key().map_err(FleetError::Config)?;
    let signer = Signer::new(key.expose().as_bytes());
    let mut guard = Guard::new(signer.clone(), me.clone(), c.fleet.replay_window.get());
    let id = super::auth::random_hex(16);
    let topic = topics::command(&me, node);
    let envelope = signer.seal(&topic, &me, node, kind, &id, body);
    let bytes = serde_json::to_vec(&envelope).map_err(|e| FleetError::Broker(e.to_string()))?;
    let (client, mut events) = s.open(s.first_protocol(), true).map_err(|e| FleetError::Broker(e.to_string()))?;
    let up = topics::up(node);
    let limit = c.fleet.timeout.get();
    let outcome = tokio::time::timeout(limit, async {
        loop {
            match events.poll().await.map_err(|f| FleetError::Broker(f.text))? {
                Event::ConnAck { .. } => {
                    client.try_subscribe(&up).map_err(FleetError::Broker)?;
                    if !client.try_publish(&topic, false, bytes.clone()) {
                        return Err(FleetError::Broker("the request queue is full".into()));
                    }
                }
                Event::Refused(why) => return Err(FleetError::Broker(format!("the broker refused: {why}"))),
                Event::Publish { topic: Some(t), payload, retain: false } if t == up => {
                    let now = jiff::Timestamp::now().as_second();
                    match guard.open(&t, &payload, |f| f == node, now) {
                        Ok(e) if e.kind == wire::REPLY && e.id == id => {
                            return serde_json::from_str::<wire::Reply>(&e.body)
                                .map_err(|err| FleetError::Broker(format!("a reply that is not one: {err}")));
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!("fleet: refused a message from {node}: {err}"),
                    }
                }
                _ => {}
            }
        }
    })
    .await;
    client.try_disconnect();
    outcome.unwrap_or(Err(FleetError::NoAnswer(node.clone(), limit.as_secs())))
}
