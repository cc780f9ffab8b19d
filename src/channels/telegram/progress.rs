//! One status message per chat while a turn runs tools: "running `df -h /`…",
//! edited as the turn moves on, deleted when the answer is delivered.
//!
//! A 60-second turn against a local model otherwise shows nothing but
//! "typing". Telegram limits edits, so a chat's message is edited at most once
//! per [`MIN_EDIT_GAP`], always to the newest step (steps in between are
//! skipped, not queued). A 429 that asks for a long pause (short ones are
//! waited out by the API client) silences the chat's status until its answer:
//! it is never retried blindly. Scheduled deliveries never get one: only chat
//! turns report steps (the agent decides), and the outbox is untouched.
//!
//! The agent calls [`Progress::step`] on the runtime thread; it only records
//! the step and, if needed, starts the chat's worker task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bus::Conversation;
use crate::clients::telegram::Api;

/// At most one edit per chat this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(2);
/// Chats tracked at once; beyond it new steps are not shown.
const MAX_CHATS: usize = 256;

/// The status messages of all chats.
#[derive(Clone)]
pub struct Progress {
    api: Arc<Api>,
    chats: Arc<Mutex<HashMap<String, Status>>>,
}

#[derive(Default)]
struct Status {
    /// The status message, once sent.
    message: Option<i64>,
    /// The newest step, and the one on screen.
    wanted: Option<String>,
    shown: Option<String>,
    /// A worker task is running for the chat.
    worker: bool,
    /// Telegram asked for a long pause: no more edits until the answer.
    muted: bool,
}

impl Progress {
    pub fn new(api: Arc<Api>) -> Progress {
        Progress { api, chats: Arc::new(Mutex::new(HashMap::new())) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Status>> {
        self.chats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer for `chat` is being delivered: remove its status message.
    pub async fn finish(&self, chat: &str) {
        let message = {
            let mut chats = self.lock();
            let Some(status) = chats.get_mut(chat) else { return };
            let message = status.message.take();
            if status.worker {
                // The worker sees the entry gone and cleans up what it sends.
                status.wanted = None;
            }
            chats.remove(chat);
            message
        };
        if let Some(id) = message {
            if let Err(e) = self.api.delete_message(chat, id).await {
                tracing::debug!(error = %e, "cannot delete the status message");
            }
        }
    }

    /// Show `chat`'s newest step until there is no newer one.
    async fn work(self, chat: String) {
        loop {
            let (text, message) = {
                let mut chats = self.lock();
                let Some(s) = chats.get_mut(&chat) else { return };
                match &s.wanted {
                    Some(w) if !s.muted && s.shown.as_ref() != Some(w) => (w.clone(), s.message),
                    _ => {
                        s.worker = false;
                        return;
                    }
                }
            };
            let sent = match message {
                None => self.api.send_message_with(&chat, &text, false, None).await.map(Some),
                Some(id) => self.api.edit_message_text(&chat, id, &text, false, None).await.map(|()| None),
            };
            let orphan = {
                let mut chats = self.lock();
                match (chats.get_mut(&chat), sent) {
                    (Some(s), Ok(new)) => {
                        s.message = new.or(s.message);
                        s.shown = Some(text);
                        None
                    }
                    // The answer came while this was being sent: it goes too.
                    (None, Ok(Some(id))) => Some(id),
                    (None, _) => return,
                    (Some(s), Err(e)) => {
                        tracing::debug!(error = %e, "cannot update the status message; silent until the answer");
                        s.muted = true;
                        s.worker = false;
                        return;
                    }
                }
            };
            if let Some(id) = orphan {
                let _ = self.api.delete_message(&chat, id).await;
                return;
            }
            tokio::time::sleep(MIN_EDIT_GAP).await;
        }
    }
}

impl crate::agent::ProgressSink for Progress {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel != crate::bus::Channel::Telegram {
            return;
        }
        let chat = conversation.chat_id.clone();
        let start = {
            let mut chats = self.lock();
            if !chats.contains_key(&chat) && chats.len() >= MAX_CHATS {
                return;
            }
            let s = chats.entry(chat.clone()).or_default();
            if s.muted {
                return;
            }
            s.wanted = Some(what.to_string());
            !std::mem::replace(&mut s.worker, true)
        };
        if start {
            tokio::spawn(self.clone().work(chat));
        }
    }
}
