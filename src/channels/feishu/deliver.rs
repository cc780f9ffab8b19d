//! Delivery to `feishu:<chat_id>`: a report as a text message; a
//! reminder's report as an interactive card (message card JSON: a
//! `markdown` element and an `action` row of buttons) with Done · 10 min ·
//! 1 h · Tomorrow. A button's `value` carries Telegram's `r:<action>:<job>`
//! ([`crate::channels::telegram::buttons`]) and the report's text (for a
//! snooze), so a press needs no state of ours. Each report is sent with a
//! `uuid` made from its outbox id and time: a retry after a lost answer is
//! the same message (the API de-duplicates a uuid for an hour).
//!
//! A report's files are uploaded first ("Upload image" for JPEG, PNG, WEBP,
//! GIF, TIFF, BMP and ICO up to 10 MB; "Upload file" for the rest, and for
//! a larger image, up to 30 MB, `file_type` from the extension), then the
//! text goes, then one `image` or `file` message per file, each with its own
//! uuid. A file that cannot go (too large, empty, missing, refused by the
//! platform) becomes a line in the text: the report is never lost for it.
//! An upload that fails for a reason that may pass (no answer within
//! `[feishu] upload_timeout_secs`, a 5xx, a rate limit) sends nothing and
//! the report goes back to the outbox. The answer recalls the turn's status
//! card ([`super::progress`]).

use std::sync::Arc;

use serde_json::{json, Value};

use super::Shared;
use crate::bus::{is_feishu_id, Target};
use crate::clients::feishu::{FeishuError, Upload, MAX_FILE, MAX_IMAGE};
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
        let mut sent_files = Vec::new();
        let mut notes = Vec::new();
        for path in report.attach {
            match self.upload(path).await? {
                Ok(file) => sent_files.push(file),
                Err(note) => notes.push(note),
            }
        }
        // The answer replaces the turn's status card.
        super::progress::finish(&self.shared, chat).await;
        let mut text = report.text.trim_end().to_string();
        for note in &notes {
            text = format!("{text}\n{note}").trim_start().to_string();
        }
        let client = &self.shared.client;
        let reminder = report.job.filter(|j| j.reminder);
        if !text.is_empty() || sent_files.is_empty() || reminder.is_some() {
            let text = if text.is_empty() { "(empty message)".to_string() } else { text };
            let uuid = uuid_of(report, 0);
            let sent = match reminder {
                Some(job) => client.send_message(chat, "interactive", &reminder_card(&text, &job.id), &uuid).await,
                None => client.send_message(chat, "text", &json!({"text": text}), &uuid).await,
            };
            sent.map_err(delivery_error)?;
        }
        for (i, (msg_type, content)) in sent_files.iter().enumerate() {
            // Parts already sent go again on a retry, with the same uuid: one message.
            client.send_message(chat, msg_type, content, &uuid_of(report, i + 1)).await.map_err(delivery_error)?;
        }
        Ok(())
    }

    /// One attachment uploaded: `Ok(Ok((msg_type, content)))` to send,
    /// `Ok(Err(note))` when it cannot go (the note says why), `Err` when
    /// trying later may work (the report goes back to the outbox).
    async fn upload(&self, path: &str) -> Result<Result<(&'static str, Value), String>, DeliveryError> {
        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
        let (ws, p) = (self.shared.workspace.clone(), path.to_string());
        let data = match crate::util::tasks::blocking(move || read(&ws, &p)).await {
            Ok(data) => data,
            Err(why) => {
                tracing::warn!(path, "an attachment cannot be sent to Feishu / Lark: {why}; telling the chat");
                return Ok(Err(format!("(The file {path} was not sent: {why}.)")));
            }
        };
        let mime = crate::channels::inbox::mime_of(&name);
        let client = &self.shared.client;
        let sent = match kind(&name, data.len() as u64) {
            Kind::Image => client.upload_image(&name, mime, data).await.map(|k| ("image", json!({"image_key": k}))),
            Kind::File(file_type) => client
                .upload_file(Upload { file_type, name: &name, mime, data })
                .await
                .map(|k| ("file", json!({"file_key": k}))),
        };
        match sent {
            Ok(msg) => Ok(Ok(msg)),
            Err(e) if e.is_retryable() || matches!(e, FeishuError::Redirect { .. }) => Err(delivery_error(e)),
            Err(e) => {
                tracing::warn!(path, error = %e, "Feishu / Lark refused an attachment; telling the chat");
                Ok(Err(format!("(The file {path} was not sent: {e}.)")))
            }
        }
    }
}

/// How a file goes: "Upload image", or "Upload file" with its `file_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image,
    File(&'static str),
}

/// An image the platform shows as one (up to its 10 MB), else a file of the
/// documented `file_type` for its extension (`stream` for any other; an
/// `.mp4` goes as a file too: a `media` message needs a cover image).
fn kind(name: &str, size: u64) -> Kind {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "jpg" | "jpeg" | "png" | "webp" | "gif" | "tif" | "tiff" | "bmp" | "ico" if size <= MAX_IMAGE => Kind::Image,
        "pdf" => Kind::File("pdf"),
        "doc" | "docx" => Kind::File("doc"),
        "xls" | "xlsx" => Kind::File("xls"),
        "ppt" | "pptx" => Kind::File("ppt"),
        _ => Kind::File("stream"),
    }
}

/// A workspace file's bytes, when the platform can take it; else why not.
fn read(ws: &crate::workspace::Workspace, path: &str) -> Result<Vec<u8>, String> {
    let (file, stat) = ws.open_regular(path).map_err(|e| e.to_string())?;
    let size = stat.st_size as u64;
    if size > MAX_FILE {
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        return Err(format!(
            "it is {:.1} MB, over Feishu / Lark's limit of {:.0} MB; it stays in the workspace",
            mb(size),
            mb(MAX_FILE)
        ));
    }
    if size == 0 {
        return Err("it is empty (Feishu / Lark takes no empty file)".into());
    }
    let mut data = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE), &mut data).map_err(|e| e.to_string())?;
    Ok(data)
}

impl Channel for FeishuChannel {
    fn name(&self) -> &'static str {
        "feishu"
    }

    fn capabilities(&self) -> Capabilities {
        // Card buttons answer a reminder; files are uploaded; a turn's status
        // is a card edited in place; no typing indicator (the API has none).
        Capabilities { files: true, buttons: true, edits: true, typing: false }
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

/// The same for every retry of one outbox report's `part` (0 the text, then
/// each file); random outside the outbox. At most 50 characters (the API's limit).
fn uuid_of(report: &Report<'_>, part: usize) -> String {
    let id = match report.id {
        0 => format!("bramble-{}", crate::scheduler::job::new_id()),
        n => format!("bramble-{n}-{}", report.created.as_millisecond()),
    };
    let id = if part == 0 { id } else { format!("{id}-{part}") };
    id.chars().take(50).collect()
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
    fn images_within_their_cap_go_as_images_and_the_rest_as_files_of_a_documented_type() {
        assert_eq!(kind("chart.PNG", 1024), Kind::Image);
        assert_eq!(kind("photo.jpeg", MAX_IMAGE), Kind::Image);
        assert_eq!(kind("photo.jpeg", MAX_IMAGE + 1), Kind::File("stream"), "a larger image goes as a file");
        assert_eq!(kind("report.pdf", 10), Kind::File("pdf"));
        assert_eq!(kind("sheet.xlsx", 10), Kind::File("xls"));
        assert_eq!(kind("talk.pptx", 10), Kind::File("ppt"));
        assert_eq!(kind("letter.docx", 10), Kind::File("doc"));
        assert_eq!(kind("clip.mp4", 10), Kind::File("stream"), "a media message would need a cover image");
        assert_eq!(kind("noext", 10), Kind::File("stream"));
    }

    #[test]
    fn a_files_limits_are_said_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let ws = crate::workspace::Workspace::strict(dir.path());
        std::fs::File::create(dir.path().join("big.bin")).unwrap().set_len(MAX_FILE + 1).unwrap();
        std::fs::write(dir.path().join("empty.txt"), b"").unwrap();
        std::fs::write(dir.path().join("ok.txt"), b"ok").unwrap();
        assert!(read(&ws, "big.bin").unwrap_err().contains("over Feishu / Lark's limit of 30 MB"));
        assert!(read(&ws, "empty.txt").unwrap_err().contains("empty"));
        assert!(read(&ws, "/etc/passwd").is_err(), "nothing from outside the workspace");
        assert_eq!(read(&ws, "ok.txt").unwrap(), b"ok");
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
