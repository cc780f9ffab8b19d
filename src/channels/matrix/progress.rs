//! One status notice per room while a chat turn runs tools ("reading
//! notes.md…"), edited in place (`m.replace`) as the turn moves on and
//! redacted when the answer is delivered: what Telegram's status message does
//! (`channels/telegram/progress.rs`), in Matrix's terms.
//!
//! Homeservers rate-limit sends (Synapse: 0.2 a second with a burst of 10 by
//! default), and an edit is a send, so a room's notice changes at most once
//! per [`MIN_EDIT_GAP`], always to the newest step (steps in between are
//! skipped, not queued). A failed send silences the room's status until its
//! answer; it is never retried. Scheduled deliveries never get one: only chat
//! turns report steps. The agent calls [`Progress::step`] on the runtime
//! thread; it only records the step and, if needed, starts the room's worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::Shared;
use crate::bus::Conversation;

/// At most one send or edit per room this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(5);
/// Rooms tracked at once; beyond it new steps are not shown.
const MAX_ROOMS: usize = 256;

/// The status notices of all rooms (kept in [`Shared`], so delivery can end them).
#[derive(Default)]
pub struct Statuses(Mutex<HashMap<String, Status>>);

#[derive(Default)]
struct Status {
    /// The notice's event, once sent.
    event: Option<String>,
    /// The newest step, and the one on screen.
    wanted: Option<String>,
    shown: Option<String>,
    /// A worker task is running for the room.
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

/// The answer for `room` is being delivered: redact its status notice.
pub(super) async fn finish(shared: &Shared, room: &str) {
    let event = {
        let mut rooms = shared.progress.lock();
        let Some(status) = rooms.remove(room) else { return };
        status.event
    };
    if let Some(id) = event {
        if let Err(e) = shared.client.redact(room, &id, &shared.txn()).await {
            tracing::debug!(error = %e, "cannot redact the Matrix status notice");
        }
    }
}

/// The notice's content: new, or an edit of `event`.
fn content(text: &str, event: Option<&str>) -> serde_json::Value {
    let body = json!({"msgtype": "m.notice", "body": text});
    match event {
        None => body,
        Some(id) => json!({
            "msgtype": "m.notice",
            "body": format!("* {text}"),
            "m.new_content": body,
            "m.relates_to": {"rel_type": "m.replace", "event_id": id},
        }),
    }
}

impl Progress {
    /// Show `room`'s newest step until there is no newer one.
    async fn work(self, room: String) {
        let shared = &self.shared;
        loop {
            let (text, event) = {
                let mut rooms = shared.progress.lock();
                let Some(s) = rooms.get_mut(&room) else { return };
                match &s.wanted {
                    Some(w) if !s.muted && s.shown.as_ref() != Some(w) => (w.clone(), s.event.clone()),
                    _ => {
                        s.worker = false;
                        return;
                    }
                }
            };
            let sent =
                shared.client.send(&room, "m.room.message", &shared.txn(), &content(&text, event.as_deref())).await;
            let orphan = {
                let mut rooms = shared.progress.lock();
                match (rooms.get_mut(&room), sent) {
                    (Some(s), Ok(id)) => {
                        s.event = s.event.take().or(Some(id));
                        s.shown = Some(text);
                        None
                    }
                    // The answer came while this was being sent: it goes too.
                    (None, Ok(id)) if event.is_none() => Some(id),
                    (None, _) => return,
                    (Some(s), Err(e)) => {
                        tracing::debug!(error = %e, "cannot update the Matrix status notice; silent until the answer");
                        s.muted = true;
                        s.worker = false;
                        return;
                    }
                }
            };
            if let Some(id) = orphan {
                let _ = shared.client.redact(&room, &id, &shared.txn()).await;
                return;
            }
            tokio::time::sleep(MIN_EDIT_GAP).await;
        }
    }
}

impl crate::agent::ProgressSink for Progress {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel != crate::bus::Channel::Matrix {
            return;
        }
        let room = conversation.chat_id.clone();
        let start = {
            let mut rooms = self.shared.progress.lock();
            if !rooms.contains_key(&room) && rooms.len() >= MAX_ROOMS {
                return;
            }
            let s = rooms.entry(room.clone()).or_default();
            if s.muted {
                return;
            }
            s.wanted = Some(what.to_string());
            !std::mem::replace(&mut s.worker, true)
        };
        if start {
            tokio::spawn(self.clone().work(room));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_a_notice_and_a_later_one_replaces_it() {
        let first = content("reading notes.md…", None);
        assert_eq!(first, json!({"msgtype": "m.notice", "body": "reading notes.md…"}));
        let edit = content("running `df -h`…", Some("$ev"));
        assert_eq!(edit["m.relates_to"], json!({"rel_type": "m.replace", "event_id": "$ev"}));
        assert_eq!(edit["m.new_content"]["body"], "running `df -h`…");
        assert_eq!(edit["msgtype"], "m.notice", "a notice: other bots (and bramble) never take it as a command");
    }
}
