//! Delivery to `feishu:<chat_id>`: a report as a text message; a
//! reminder's report as an interactive card (message card JSON: a
//! `markdown` element and an `action` row of buttons) with Done · 10 min ·
//! 1 h · Tomorrow. A button's `value` carries Telegram's `r:<action>:<job>`
//! ([`crate::channels::telegram::buttons`]) and the report's text (for a
//! snooze), so a press needs no state of ours. Each report is sent with a
//! `uuid` made from its outbox id and time: a retry after a lost answer is
//! the same message (the API de-duplicates a uuid for an hour).

use std::sync::Arc;

use serde_json::{json, Value};

use super::Shared;
use crate::bus::{is_feishu_id, Target};
use crate::clients::feishu::FeishuError;
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// How much of a report's text a button carries (for a snooze's reminder).
const BUTTON_TEXT: usize = 1000;

/// Delivers reports to `feishu:<chat_id>`.
pub struct FeishuChannel {
    shared: Arc<Shared>,
}

impl FeishuChannel {
    pub(super) fn new(shared: Arc<Shared>) -> FeishuChannel {
        FeishuChannel { shared }
    }

    async fn send(&self, chat: &str, report: &Report<'_>) -> Result<(), DeliveryError> {
        if !is_feishu_id(chat, "oc_") {
            return Err(DeliveryError::permanent(format!("`{chat}` is not a Feishu / Lark chat_id (oc_…)")));
        }
        let text = report.text_naming_files();
        let text = if text.trim().is_empty() { "(empty message)".into() } else { text };
        let uuid = uuid_of(report);
        let client = &self.shared.client;
        let sent = match report.job.filter(|j| j.reminder) {
            Some(job) => client.send_message(chat, "interactive", &reminder_card(&text, &job.id), &uuid).await,
            None => client.send_message(chat, "text", &json!({"text": text}), &uuid).await,
        };
        sent.map(drop).map_err(delivery_error)
    }
}

impl Channel for FeishuChannel {
    fn name(&self) -> &'static str {
        "feishu"
    }

    fn capabilities(&self) -> Capabilities {
        // Card buttons answer a reminder; files are named, not uploaded; no
        // progress edits (only cards can be edited) and no typing indicator.
        Capabilities { files: false, buttons: true, edits: false, typing: false }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Feishu(chat) => self.send(chat, &report).await,
                other => Err(DeliveryError::permanent(format!("the feishu channel cannot deliver to {other}"))),
            }
        })
    }
}

/// The same for every retry of one outbox report; random outside the outbox.
fn uuid_of(report: &Report<'_>) -> String {
    if report.id == 0 {
        return format!("bramble-{}", crate::scheduler::job::new_id());
    }
    format!("bramble-{}-{}", report.id, report.created.as_millisecond())
}

/// A reminder's card: its text and the four buttons.
pub fn reminder_card(text: &str, job: &str) -> Value {
    let short: String = text.chars().take(BUTTON_TEXT).collect();
    let button = |label: &str, kind: &str, action: &str| {
        json!({"tag": "button", "text": {"tag": "plain_text", "content": label}, "type": kind,
               "value": {"r": format!("r:{action}:{job}"), "text": short}})
    };
    json!({
        "config": {"wide_screen_mode": true, "update_multi": true},
        "elements": [
            {"tag": "markdown", "content": text},
            {"tag": "action", "actions": [
                button("✅ Done", "primary", "d"),
                button("💤 10 min", "default", "s10"),
                button("1 h", "default", "s60"),
                button("Tomorrow", "default", "t"),
            ]}
        ]
    })
}

/// The card after a press: the text and what was done, no buttons.
pub fn answered_card(text: &str, note: &str) -> Value {
    json!({
        "config": {"wide_screen_mode": true, "update_multi": true},
        "elements": [{"tag": "markdown", "content": format!("{}\n\n{note}", text.trim_end())}]
    })
}

fn delivery_error(e: FeishuError) -> DeliveryError {
    match &e {
        // A redirect: a config problem (api_base); kept, counted against the report.
        FeishuError::Redirect { .. } => DeliveryError::suspect(e.to_string()),
        // Refused as malformed or too long: this report's own doing.
        FeishuError::Refused { status: 400, code, .. } if !e.is_token() && *code != 230002 => {
            DeliveryError::suspect(e.to_string())
        }
        _ if e.is_retryable() => DeliveryError::retryable(e.to_string()),
        _ => DeliveryError::permanent(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reminder_card_has_the_four_buttons_telegram_understands() {
        let card = reminder_card("Water the plants", "0a1b2c3d");
        let actions = card["elements"][1]["actions"].as_array().unwrap();
        let parsed: Vec<_> = actions
            .iter()
            .map(|b| crate::channels::telegram::buttons::parse(b["value"]["r"].as_str().unwrap()).unwrap().1)
            .collect();
        assert_eq!(parsed, ["0a1b2c3d"; 4]);
        assert_eq!(actions[0]["value"]["text"], "Water the plants");
        assert!(answered_card("x", "✅ Done")["elements"].as_array().unwrap().len() == 1);
    }

    #[test]
    fn errors_are_sorted_for_the_outbox() {
        let refused = |status, code| FeishuError::Refused { what: "a message", status, code, msg: String::new() };
        assert!(delivery_error(refused(503, 0)).retryable);
        assert!(!delivery_error(refused(400, 230002)).retryable, "the bot is not in the chat");
        assert!(delivery_error(refused(400, 230001)).suspect);
        assert!(delivery_error(FeishuError::Transport("down".into())).retryable);
    }
}
