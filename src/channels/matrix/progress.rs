//! One status notice per room while a chat turn runs tools ("reading
//! notes.md…"), edited in place (`m.replace`) as the turn moves on and
//! redacted when the answer is delivered: what Telegram's status message does
//! (`channels/telegram/progress.rs`), in Matrix's terms.
//!
//! Homeservers rate-limit sends (Synapse: 0.2 a second with a burst of 10 by
//! default), and an edit is a send, so a room's notice changes at most once
//! per [`MIN_EDIT_GAP`]. The worker, the skipping of steps in between and the
//! silence after a failed send are [`crate::channels::status_edits`]'.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::Shared;
use crate::bus::Conversation;
use crate::channels::status_edits::{self, Surface};
use crate::util::BoxFuture;

pub use crate::channels::status_edits::Statuses;

/// At most one send or edit per room this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(5);

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
pub(super) async fn finish(shared: &Arc<Shared>, room: &str) {
    status_edits::finish(&Progress::new(shared.clone()), room).await;
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

impl Surface for Progress {
    const GAP: Duration = MIN_EDIT_GAP;
    const WHAT: &'static str = "the Matrix status notice";

    fn statuses(&self) -> &Statuses {
        &self.shared.progress
    }

    fn post<'a>(&'a self, room: &'a str, text: &'a str) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let sent = self.shared.client.send(room, "m.room.message", &self.shared.txn(), &content(text, None)).await;
            sent.map_err(|e| e.to_string())
        })
    }

    fn edit<'a>(&'a self, room: &'a str, id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let edit = content(text, Some(id));
            let sent = self.shared.client.send(room, "m.room.message", &self.shared.txn(), &edit).await;
            sent.map(|_| ()).map_err(|e| e.to_string())
        })
    }

    fn remove<'a>(&'a self, room: &'a str, id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.shared.client.redact(room, id, &self.shared.txn()).await {
                tracing::debug!(error = %e, "cannot redact the Matrix status notice");
            }
        })
    }
}

impl crate::agent::ProgressSink for Progress {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel == crate::bus::Channel::Matrix {
            status_edits::step(self, &conversation.chat_id, what);
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
