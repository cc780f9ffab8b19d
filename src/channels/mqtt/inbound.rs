//! Messages from the broker: `<prefix>/in` (to the agent), `<prefix>/run/<job>`
//! (to the scheduler), our own discovery documents (clean-up) and triggers.
//!
//! The [`Router`] runs inside the polling task, so it never waits: everything
//! is a `try_send` into a bounded queue, and a full queue is logged.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;

use super::{discovery, triggers, Link, Settings};
use crate::bus::{Conversation, InboundMessage, Target};
use crate::scheduler::{JobStore, SchedulerHandle};

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
    let reply_topic = match reply_to.map(|r| r.trim().to_string()).filter(|r| !r.is_empty()) {
        Some(r) if r.contains(['+', '#']) => return Err(format!("reply_to `{r}` contains a wildcard")),
        Some(r) => r,
        None => settings.topic("out"),
    };
    // A named session lives under this device's MQTT namespace: a publisher on
    // `<prefix>/in` must not be able to name (read, reset, stop) a Telegram chat's
    // session. `reply_to` may be any topic: whoever can publish here can publish
    // there themselves.
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
        conversation: Conversation::new("mqtt", reply_topic.clone(), session_key),
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
}

impl Router {
    pub(super) fn dispatch(&self, topic: &str, payload: &[u8], retained: bool) {
        let s = &self.link.settings;
        // With `inbound = false` these are not subscribed; one that comes anyway (a
        // trigger on `#`) is one of our own topics below, and never runs anything.
        if s.inbound && topic == s.topic("in") {
            if retained {
                // A retained command would run again on every reconnect.
                tracing::warn!(topic, "ignoring a retained message on the input topic");
                return;
            }
            match inbound_message(s, payload) {
                Ok(msg) => {
                    tracing::debug!(session = %msg.conversation.session_key, "MQTT message in");
                    if self.inbound.try_send(msg).is_err() {
                        tracing::warn!(topic, "the agent's queue is full: MQTT message dropped");
                    }
                }
                Err(e) => tracing::warn!(topic, "MQTT message ignored: {e}"),
            }
            return;
        }
        if let Some(job) = topic.strip_prefix(&s.topic("run/")).filter(|_| s.inbound) {
            if retained {
                tracing::warn!(topic, "ignoring a retained run request");
                return;
            }
            match self.jobs.get(job) {
                Ok(j) if self.scheduler.run_now(&j.id) => tracing::info!(job, "MQTT: running the job now"),
                Ok(_) => tracing::warn!(job, "MQTT: the scheduler is busy; run request dropped"),
                Err(e) => tracing::warn!(job, "MQTT: cannot run the job: {e}"),
            }
            return;
        }
        if s.discovery && discovery::is_own_config(s, topic) {
            discovery::check_leftover(&self.link, topic, payload);
            return;
        }
        // A retained message is old state the broker replays on every
        // (re)subscribe, not an event; and our own topics never trigger
        // (a trigger on `#` would otherwise answer its own reports).
        if retained || topic.starts_with(&format!("{}/", s.prefix)) {
            return;
        }
        self.triggers.dispatch(topic, payload);
    }
}
