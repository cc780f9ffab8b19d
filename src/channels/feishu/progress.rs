//! One status card per Feishu / Lark chat while a chat turn runs tools
//! ("⏳ running `df -h /`…"), edited in place as the turn moves on and
//! recalled when the answer is delivered: what Telegram's status message,
//! Matrix's notice and Discord's status message do, in the Open Platform's
//! terms.
//!
//! Only a card can be edited without a cap on the number of edits ("Edit
//! message", `PUT`, allows a text message 20 edits), so the status is an
//! `interactive` message with one plain-text `div` and `update_multi: true`
//! (the "Update app-sent message card" page: `PATCH
//! /open-apis/im/v1/messages/{id}`, both the old and the new card shared,
//! within 14 days, at most 5 updates a second per message). It changes at
//! most once per [`MIN_EDIT_GAP`] per chat, always to the newest step (steps
//! in between are skipped, not queued), well inside that limit and the app's
//! 50 calls a second. The answer recalls it ("Recall message", `DELETE`, the
//! bot's own message within the tenant's window, 24 h by default). A failed
//! send or edit silences the chat's status until its answer; it is never
//! retried. The agent calls [`Progress::step`] on the runtime thread; it only
//! records the step and, if needed, starts the chat's worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::Shared;
use crate::bus::Conversation;

/// At most one send or edit per chat this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(2);
/// Chats tracked at once; beyond it new steps are not shown.
const MAX_CHATS: usize = 256;
/// The most characters a status shows.
const MAX_STATUS: usize = 500;

/// The status cards of all chats (kept in [`Shared`], so delivery can end them).
#[derive(Default)]
pub struct Statuses(Mutex<HashMap<String, Status>>);

#[derive(Default)]
struct Status {
    /// The card's message id, once sent.
    message: Option<String>,
    /// The newest step, and the one on screen.
    wanted: Option<String>,
    shown: Option<String>,
    /// A worker task is running for the chat.
    worker: bool,
    /// A send failed: no more until the answer.
    muted: bool,
}

impl Statuses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Status>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The agent's side: where steps go.
#[derive(Clone)]
pub struct Progress {
    shared: Arc<Shared>,
}

impl Progress {
    pub(super) fn new(shared: Arc<Shared>) -> Progress {
        Progress { shared }
    }
}

/// The answer for `chat` is being delivered: recall its status card.
pub(super) async fn finish(shared: &Shared, chat: &str) {
    let message = {
        let mut chats = shared.progress.lock();
        let Some(status) = chats.remove(chat) else { return };
        status.message
    };
    if let Some(id) = message {
        if let Err(e) = shared.client.recall(&id).await {
            tracing::debug!(error = %e, "cannot recall the Feishu / Lark status card");
        }
    }
}

/// The status card: one line of plain text (a model's Markdown is not rendered), shared so it can be updated.
pub fn card(text: &str) -> Value {
    let text = format!("⏳ {text}");
    let text: String = match text.chars().count() > MAX_STATUS {
        true => format!("{}…", text.chars().take(MAX_STATUS - 1).collect::<String>()),
        false => text,
    };
    json!({
        "config": {"wide_screen_mode": true, "update_multi": true},
        "elements": [{"tag": "div", "text": {"tag": "plain_text", "content": text}}]
    })
}

impl Progress {
    /// Show `chat`'s newest step until there is no newer one.
    async fn work(self, chat: String) {
        let shared = &self.shared;
        loop {
            let (text, message) = {
                let mut chats = shared.progress.lock();
                let Some(s) = chats.get_mut(&chat) else { return };
                match &s.wanted {
                    Some(w) if !s.muted && s.shown.as_ref() != Some(w) => (w.clone(), s.message.clone()),
                    _ => {
                        s.worker = false;
                        return;
                    }
                }
            };
            let sent = match &message {
                None => {
                    let uuid = format!("bramble-p-{}", crate::scheduler::job::new_id());
                    shared.client.send_message(&chat, "interactive", &card(&text), &uuid).await.map(Some)
                }
                Some(id) => shared.client.update_card(id, &card(&text)).await.map(|()| None),
            };
            let orphan = {
                let mut chats = shared.progress.lock();
                match (chats.get_mut(&chat), sent) {
                    (Some(s), Ok(new)) => {
                        s.message = s.message.take().or(new.filter(|id| !id.is_empty()));
                        s.shown = Some(text);
                        None
                    }
                    // The answer came while this was being sent: it goes too.
                    (None, Ok(Some(id))) => Some(id),
                    (None, _) => return,
                    (Some(s), Err(e)) => {
                        tracing::debug!(error = %e, "cannot update the Feishu / Lark status card; silent until the answer");
                        s.muted = true;
                        s.worker = false;
                        return;
                    }
                }
            };
            if let Some(id) = orphan.filter(|id| !id.is_empty()) {
                let _ = shared.client.recall(&id).await;
                return;
            }
            tokio::time::sleep(MIN_EDIT_GAP).await;
        }
    }
}

impl crate::agent::ProgressSink for Progress {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel != crate::bus::Channel::Feishu
            || !crate::bus::is_feishu_id(&conversation.chat_id, "oc_")
        {
            return;
        }
        let chat = conversation.chat_id.clone();
        let start = {
            let mut chats = self.shared.progress.lock();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_a_shared_plain_text_card_within_its_cap() {
        let c = card("running `df -h /`…");
        assert_eq!(c["config"]["update_multi"], true, "only a shared card may be updated");
        assert_eq!(c["elements"][0]["text"]["tag"], "plain_text");
        assert_eq!(c["elements"][0]["text"]["content"], "⏳ running `df -h /`…");
        let long = card(&"é".repeat(2000));
        let shown = long["elements"][0]["text"]["content"].as_str().unwrap();
        assert_eq!(shown.chars().count(), MAX_STATUS);
        assert!(shown.ends_with('…'));
    }
}
