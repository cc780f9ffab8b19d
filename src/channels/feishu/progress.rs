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
//! retried (the engine: [`crate::channels::status_edits`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::Shared;
use crate::bus::Conversation;
use crate::channels::status_edits::{self, Surface};
use crate::util::BoxFuture;

pub use crate::channels::status_edits::Statuses;

/// At most one send or edit per chat this often.
pub const MIN_EDIT_GAP: Duration = Duration::from_secs(2);
/// The most characters a status shows.
const MAX_STATUS: usize = 500;

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
pub(super) async fn finish(shared: &Arc<Shared>, chat: &str) {
    status_edits::finish(&Progress::new(shared.clone()), chat).await;
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

impl Surface for Progress {
    const GAP: Duration = MIN_EDIT_GAP;
    const WHAT: &'static str = "the Feishu / Lark status card";

    fn statuses(&self) -> &Statuses {
        &self.shared.progress
    }

    fn post<'a>(&'a self, chat: &'a str, text: &'a str) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let uuid = format!("bramble-p-{}", crate::scheduler::job::new_id());
            let sent = self.shared.client.send_message(chat, "interactive", &card(text), &uuid).await;
            sent.map_err(|e| e.to_string())
        })
    }

    fn edit<'a>(&'a self, _: &'a str, id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.shared.client.update_card(id, &card(text)).await.map_err(|e| e.to_string()) })
    }

    fn remove<'a>(&'a self, _: &'a str, id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.shared.client.recall(id).await {
                tracing::debug!(error = %e, "cannot recall the Feishu / Lark status card");
            }
        })
    }
}

impl crate::agent::ProgressSink for Progress {
    fn step(&self, conversation: &Conversation, what: &str) {
        if conversation.channel == crate::bus::Channel::Feishu && crate::bus::is_feishu_id(&conversation.chat_id, "oc_")
        {
            status_edits::step(self, &conversation.chat_id, what);
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
