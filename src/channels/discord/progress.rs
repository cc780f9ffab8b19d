//! One status message per Discord channel while a turn runs tools ("⏳
//! running `df -h /`…"), edited as the turn moves on and deleted when the
//! answer is delivered — Telegram's progress, over Discord's create / edit /
//! delete. At most one edit per channel every [`MIN_EDIT_GAP`], always to the
//! newest step; a failed edit (a rate limit) silences the channel's status
//! until its answer. Steps of other channels go on to the next sink.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::bus::Conversation;
use crate::clients::discord::Rest;

/// At most one edit per channel this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(2);
/// Channels tracked at once; beyond it new steps are not shown.
const MAX_CHANNELS: usize = 256;

/// The status messages of all channels.
#[derive(Clone)]
pub struct Progress {
    rest: Arc<Rest>,
    chats: Arc<Mutex<HashMap<u64, Status>>>,
}

#[derive(Default)]
struct Status {
    message: Option<u64>,
    wanted: Option<String>,
    shown: Option<String>,
    worker: bool,
    muted: bool,
}

impl Progress {
    pub fn new(rest: Arc<Rest>) -> Progress {
        Progress { rest, chats: Arc::new(Mutex::new(HashMap::new())) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Status>> {
        self.chats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer for `channel` is being delivered: remove its status message.
    pub async fn finish(&self, channel: u64) {
        let message = self.lock().remove(&channel).and_then(|s| s.message);
        if let Some(id) = message {
            if let Err(e) = self.rest.delete_message(channel, id).await {
                tracing::debug!(error = %e, "cannot delete the Discord status message");
            }
        }
    }

    fn step(&self, channel: u64, what: &str) {
        let start = {
            let mut chats = self.lock();
            if !chats.contains_key(&channel) && chats.len() >= MAX_CHANNELS {
                return;
            }
            let s = chats.entry(channel).or_default();
            if s.muted {
                return;
            }
            s.wanted = Some(what.to_string());
            !std::mem::replace(&mut s.worker, true)
        };
        if start {
            tokio::spawn(self.clone().work(channel));
        }
    }

    /// Show `channel`'s newest step until there is no newer one.
    async fn work(self, channel: u64) {
        loop {
            let (text, message) = {
                let mut chats = self.lock();
                let Some(s) = chats.get_mut(&channel) else { return };
                match &s.wanted {
                    Some(w) if !s.muted && s.shown.as_ref() != Some(w) => (w.clone(), s.message),
                    _ => {
                        s.worker = false;
                        return;
                    }
                }
            };
            let body = json!({"content": super::deliver::cut(&format!("⏳ {text}"), super::deliver::MAX_CONTENT),
                              "allowed_mentions": {"parse": []}});
            let sent = match message {
                None => self.rest.create_message(channel, &body).await.map(Some),
                Some(id) => self.rest.edit_message(channel, id, &body).await.map(|()| None),
            };
            let orphan = {
                let mut chats = self.lock();
                match (chats.get_mut(&channel), sent) {
                    (Some(s), Ok(new)) => {
                        s.message = new.or(s.message);
                        s.shown = Some(text);
                        None
                    }
                    // The answer came while this was being sent: it goes too.
                    (None, Ok(Some(id))) => Some(id),
                    (None, _) => return,
                    (Some(s), Err(e)) => {
                        tracing::debug!(error = %e, "cannot update the Discord status message; silent until the answer");
                        s.muted = true;
                        s.worker = false;
                        return;
                    }
                }
            };
            if let Some(id) = orphan {
                let _ = self.rest.delete_message(channel, id).await;
                return;
            }
            tokio::time::sleep(MIN_EDIT_GAP).await;
        }
    }
}

/// Discord's status messages, then whatever sink handles the other channels.
pub struct Chain {
    pub discord: Progress,
    pub next: Option<Arc<dyn crate::agent::ProgressSink>>,
}

impl crate::agent::ProgressSink for Chain {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel != crate::bus::Channel::Discord {
            if let Some(next) = &self.next {
                next.step(conversation, what);
            }
            return;
        }
        if let Ok(channel) = conversation.chat_id.parse::<u64>() {
            self.discord.step(channel, what);
        }
    }
}
