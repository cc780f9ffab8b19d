//! Messages from the broker: `<prefix>/in` (to the agent), `<prefix>/run/<job>`
//! (to the scheduler), our own discovery documents (clean-up) and triggers.
//!
//! The [`Router`] runs inside the polling task, so it never waits: everything
//! is a `try_send` into a bounded queue, and a full queue is logged.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;

use super::{discovery, triggers, Link, Settings, TurnLimit};
use crate::bus::{Conversation, InboundMessage, Target};
use crate::scheduler::{JobStore, SchedulerHandle};
use crate::util::mqtt::Input;

/// A `<prefix>/in` payload in JSON form.
#[derive(Deserialize)]
struct InPayload {
    text: String,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    reply_to: Option<String>,
}

/// Parse a `<prefix>/in` payload: JSON `{"text","session","reply_to"}` or plain text.
pub fn inbound_message(settings: &Settings, payload: &[u8]) -> Result<InboundMessage, String> {
    let raw = String::from_utf8_lossy(payload);
    let parsed = if raw.trim_start().starts_with('{') {
        Some(serde_json::from_str::<InPayload>(&raw).map_err(|e| format!("not a valid JSON message ({e})"))?)
    } else {
        None
    };
    let (text, session, reply_to) = match parsed {
        Some(p) => (p.text, p.session, p.reply_to),
        None => (raw.into_owned(), None, None),
    };
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err("empty message".into());
    }
    // `reply_to` may be any topic whoever can publish here could publish to
    // themselves, but none bramble listens to (the answer would come back as the
    // next message: a loop of model turns) and none a broker would close the
    // connection on (the reply would stall the channel). Refused here, before
    // the turn, so nothing is spent on an answer that cannot go out.
    let reply_topic = match reply_to.map(|r| r.trim().to_string()).filter(|r| !r.is_empty()) {
        Some(r) => match settings.inputs.refuse(&r) {
            Ok(()) => r,
            Err(e) => return Err(format!("reply_to `{}`: {e}", r.escape_debug())),
        },
        None => settings.topic("out"),
    };
    // A named session lives under this device's MQTT namespace: a publisher on
    // `<prefix>/in` must not be able to name (read, reset, stop) a Telegram chat's
    // session.
    let session_key = match session.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()) {
        None => format!("mqtt:{}", settings.prefix),
        Some(s) if s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) => {
            format!("mqtt:{}:{s}", settings.prefix)
        }
        Some(s) => {
            return Err(format!("session `{s}` is not a session name: use up to 64 letters, digits, `_`, `-` or `.`"))
        }
    };
    Ok(InboundMessage {
        conversation: Conversation::new(crate::bus::Channel::Mqtt, reply_topic.clone(), session_key),
        sender: "mqtt".into(),
        principal: crate::bus::Principal::Anonymous,
        text,
        reply_to: Target::Mqtt(Some(reply_topic)),
        attachments: Vec::new(),
    })
}

/// Inbound messages, sorted by topic. Runs inside the polling task, so it
/// never waits: everything is a `try_send` into a bounded queue.
pub(super) struct Router {
    pub(super) link: Arc<Link>,
    pub(super) inbound: mpsc::Sender<InboundMessage>,
    pub(super) scheduler: SchedulerHandle,
    pub(super) jobs: JobStore,
    pub(super) triggers: Arc<triggers::Triggers>,
    /// Turns `<prefix>/in` may start ([`TurnLimit`]).
    pub(super) turns: TurnLimit,
    /// Where the fleet's topics go (`crate::fleet`): topic, payload, retained.
    pub(super) fleet: Option<mpsc::Sender<super::FleetMessage>>,
}

impl Router {
    /// Route one message by what its topic is to us ([`crate::util::mqtt::InputTopics`]:
    /// the same list we subscribed to). A retained message is old state the
    /// broker replays on every (re)subscribe, not an event: it runs nothing.
    pub(super) fn dispatch(&self, topic: &str, payload: &[u8], retained: bool) {
        let s = &self.link.settings;
        match s.inputs.classify(topic) {
            Some(Input::Agent) if retained => {
                // A retained command would run again on every reconnect.
                tracing::warn!(topic, "ignoring a retained message on the input topic");
            }
            Some(Input::Agent) => self.agent_message(topic, payload),
            Some(Input::Run(_)) if retained => tracing::warn!(topic, "ignoring a retained run request"),
            Some(Input::Run(job)) => match self.jobs.get(job) {
                Ok(j) if self.scheduler.run_now(&j.id) => tracing::info!(job, "MQTT: running the job now"),
                Ok(_) => tracing::warn!(job, "MQTT: the scheduler is busy; run request dropped"),
                Err(e) => tracing::warn!(job, "MQTT: cannot run the job: {e}"),
            },
            Some(Input::Discovery) => discovery::check_leftover(&self.link, topic, payload),
            Some(Input::Trigger) if !retained => self.triggers.dispatch(topic, payload),
            Some(Input::Fleet) => match &self.fleet {
                Some(fleet) if fleet.try_send((topic.to_string(), payload.to_vec(), retained)).is_err() => {
                    tracing::warn!(topic, "the fleet's queue is full: message dropped")
                }
                _ => {}
            },
            Some(Input::Trigger) | None => {}
        }
    }

    /// `<prefix>/in`: parsed, rate-limited, and handed to the agent.
    fn agent_message(&self, topic: &str, payload: &[u8]) {
        let msg = match inbound_message(&self.link.settings, payload) {
            Ok(msg) => msg,
            Err(e) => return tracing::warn!(topic, "MQTT message ignored: {e}"),
        };
        if !self.turns.allow() {
            return;
        }
        tracing::debug!(session = %msg.conversation.session_key, "MQTT message in");
        if self.inbound.try_send(msg).is_err() {
            tracing::warn!(topic, "the agent's queue is full: MQTT message dropped");
        }
    }
}
