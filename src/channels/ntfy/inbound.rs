//! Reading `[ntfy] subscribe`: one JSON stream for all of them
//! (`/<topic>,<topic>/json`), each message typed in the ntfy app a turn in
//! session `ntfy:<topic>`, answered on the topic.
//!
//! Only the configured topics are ever subscribed (the allow-list), and a
//! line whose `topic` is another is dropped. The stream is long-lived: a
//! drop, a refused connection or [`IDLE`] without even a keepalive is
//! followed by a reconnect with backoff (1 s doubling to 5 min), asking
//! `since=<the last id handled>`, so what was published meanwhile comes
//! once. The id is written to `ntfy-since.json` after the message is on the
//! bus: a crash in between hands it over again rather than losing it, and a
//! repeated id is dropped. Messages tagged [`OWN_TAG`] are bramble's own
//! (its answers, on the same topic) and never input. Turns are rate-limited
//! (`turns_per_minute`); a line that is too long or not an event is logged
//! and skipped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Shared, OWN_TAG, SINCE_FILE};
use crate::bus::{Channel, Conversation, InboundMessage, Principal, Target};
use crate::channels::mqtt::{TurnLimit, TurnRate};
use crate::clients::ntfy::{Event, Line};
use crate::util::shutdown::Shutdown;

/// No line (ntfy sends a keepalive every 45 s by default) for this long: reconnect.
pub const IDLE: Duration = Duration::from_secs(150);
/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Waiting for room on the bus.
const BUS_WAIT: Duration = Duration::from_secs(30);
/// Ids remembered per topic to drop a repeat.
const RECENT: usize = 64;

/// `ntfy-since.json`: the server, the topics read and the last id handled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SinceState {
    pub server: String,
    pub topics: Vec<String>,
    pub last: Option<String>,
}

impl SinceState {
    /// The saved position for `server` and `topics` (another server's, or
    /// another set of topics', is not ours: read from now).
    pub fn load(state_dir: &std::path::Path, server: &str, topics: &[String]) -> SinceState {
        let read = std::fs::read(state_dir.join(SINCE_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok());
        match read {
            Some(s @ SinceState { .. }) if s.server == server && s.topics == topics => s,
            _ => SinceState { server: server.to_string(), topics: topics.to_vec(), last: None },
        }
    }
}

/// The subscriber: a service the daemon runs (restarted: its position is in the file).
#[derive(Clone)]
pub struct Subscriber {
    shared: Arc<Shared>,
    inbound: mpsc::Sender<InboundMessage>,
    turns: Arc<TurnLimit>,
}

impl Subscriber {
    pub fn new(shared: Arc<Shared>, inbound: mpsc::Sender<InboundMessage>) -> Subscriber {
        let rate = TurnRate { per_minute: shared.cfg.turns_per_minute, burst: shared.cfg.turn_burst };
        Subscriber { shared, inbound, turns: Arc::new(TurnLimit::new(rate, "the ntfy topics")) }
    }

    /// Read every subscribed topic until the stop.
    pub async fn run(self, shutdown: Shutdown) {
        let server = self.shared.cfg.server.as_ref().map(|s| s.as_str().to_string()).unwrap_or_default();
        let topics = self.shared.cfg.subscribe.clone();
        let since = SinceState::load(&self.shared.state_dir, &server, &topics);
        let reader = Reader {
            shared: self.shared.clone(),
            inbound: self.inbound.clone(),
            turns: self.turns.clone(),
            since,
            path: topics.join(","),
            recent: VecDeque::new(),
            stop: shutdown.stop_token().clone(),
        };
        reader.run().await
    }
}

/// The topics' stream.
struct Reader {
    shared: Arc<Shared>,
    inbound: mpsc::Sender<InboundMessage>,
    turns: Arc<TurnLimit>,
    since: SinceState,
    /// `<topic>,<topic>`.
    path: String,
    recent: VecDeque<String>,
    stop: CancellationToken,
}

impl Reader {
    async fn run(mut self) {
        let mut backoff = Duration::from_secs(1);
        let mut last_error = String::new();
        while !self.stop.is_cancelled() {
            let since = self.since.last.clone();
            let opened = tokio::select! {
                r = self.shared.client.subscribe(&self.path, since.as_deref()) => r,
                _ = self.stop.cancelled() => return,
            };
            match opened {
                Ok(mut stream) => {
                    tracing::info!(topics = %self.path, since = since.as_deref().unwrap_or("now"), "ntfy: subscribed");
                    last_error.clear();
                    backoff = Duration::from_secs(1);
                    match self.read(&mut stream).await {
                        Ok(()) => return,
                        Err(why) => tracing::warn!(topics = %self.path, "ntfy: the stream ended ({why}); reconnecting"),
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(topics = %self.path, "ntfy: cannot subscribe: {text}; trying again with backoff");
                        last_error = text;
                    }
                    if !e.retryable() {
                        backoff = MAX_BACKOFF;
                    }
                }
            }
            tokio::select! {
                () = crate::util::timer::sleep(backoff) => {}
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Lines until the stop (`Ok`) or the stream's end (`Err`: why).
    async fn read(&mut self, stream: &mut crate::clients::ntfy::Stream) -> Result<(), String> {
        loop {
            let line = tokio::select! {
                l = tokio::time::timeout(IDLE, stream.next()) => l,
                _ = self.stop.cancelled() => return Ok(()),
            };
            match line {
                Err(_) => return Err(format!("nothing for {} s", IDLE.as_secs())),
                Ok(Err(e)) => return Err(e.to_string()),
                Ok(Ok(None)) => return Err("closed by the server".into()),
                Ok(Ok(Some(Line::Skipped(why)))) => tracing::warn!(topics = %self.path, "ntfy: skipped {why}"),
                Ok(Ok(Some(Line::Event(e)))) if e.event == "message" => {
                    if !self.message(e).await {
                        return Ok(()); // stopping: the message comes again after a restart
                    }
                }
                Ok(Ok(Some(Line::Event(_)))) => {} // open, keepalive, poll_request, newer events
            }
        }
    }

    /// One message: handed over or skipped, then remembered. `false`: stopping.
    async fn message(&mut self, e: Event) -> bool {
        if e.id.is_empty() || self.recent.contains(&e.id) {
            return true;
        }
        if !self.shared.cfg.subscribe.contains(&e.topic) {
            tracing::warn!(topics = %self.path, other = %e.topic.escape_debug(), "ntfy: a message for another topic was dropped");
            return true;
        }
        if e.tags.iter().any(|t| t == OWN_TAG) {
            tracing::debug!(topics = %self.path, id = %e.id, "ntfy: bramble's own message, not input");
        } else if e.message.trim().is_empty() {
            tracing::debug!(topics = %self.path, id = %e.id, "ntfy: an empty message was skipped");
        } else if !self.turns.allow() {
            tracing::warn!(topics = %self.path, id = %e.id, "ntfy: too many messages; this one was dropped");
        } else if !self.hand_over(&e).await {
            return false;
        }
        self.remember(e.id).await;
        true
    }

    async fn hand_over(&self, e: &Event) -> bool {
        let topic = &e.topic;
        let mut text: String = e.message.chars().take(self.shared.cfg.max_message_chars).collect();
        if let Some(name) = e.attachment.as_ref().map(|a| a["name"].as_str().unwrap_or("a file").to_string()) {
            text.push_str(&format!("\n[attachment {name}: not fetched]"));
        }
        let msg = InboundMessage {
            conversation: Conversation::new(Channel::Ntfy, topic.clone(), format!("ntfy:{topic}")),
            sender: format!("ntfy:{topic}"),
            principal: Principal::Anonymous,
            text,
            reply_to: Target::Ntfy(topic.clone()),
            attachments: Vec::new(),
        };
        tracing::info!(topic, id = %e.id, "ntfy: a message from the topic: a turn in session ntfy:{topic}");
        crate::channels::inbox::hand_over(&self.inbound, msg, BUS_WAIT, &self.stop).await
    }

    /// Remember `id` as handled: in memory and in `ntfy-since.json`.
    async fn remember(&mut self, id: String) {
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(id.clone());
        self.since.last = Some(id);
        let (data, path) = (serde_json::to_vec(&self.since), self.shared.state_dir.join(SINCE_FILE));
        let Ok(data) = data else { return };
        let saved = crate::util::tasks::blocking(move || crate::util::fs::write_atomic(&path, &data)).await;
        if let Err(e) = saved {
            tracing::warn!(error = %e, "ntfy: cannot save the stream position; after a restart a message may come again");
        }
    }
}
