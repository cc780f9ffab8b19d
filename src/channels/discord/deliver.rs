//! Delivery to `discord:<channel id>`: the report as messages of at most
//! 2000 characters (Discord's limit; Discord renders the Markdown the model
//! writes as it is), Done / 10 min / 1 h / Tomorrow buttons under a
//! reminder's last part (message components; the `custom_id`s are
//! Telegram's `r:<action>:<job id>`, resolved by the same code), and each
//! file as an attachment (multipart). Mentions in a report never ping
//! anyone (`allowed_mentions: {parse: []}`): a model's `@everyone` is text.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use super::Shared;
use crate::bus::Target;
use crate::clients::discord::{DiscordError, FilePart};
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// The most characters a message's content may have.
pub const MAX_CONTENT: usize = 2000;
/// The largest file sent (Discord's upload limit for a server without boosts).
const MAX_UPLOAD: u64 = 10 * 1024 * 1024;

/// Delivers reports to `discord:<channel id>`.
pub struct DiscordChannel {
    shared: Arc<Shared>,
    workspace: crate::workspace::Workspace,
}

impl DiscordChannel {
    pub(super) fn new(shared: Arc<Shared>, workspace: &Path) -> DiscordChannel {
        DiscordChannel { shared, workspace: crate::workspace::Workspace::strict(workspace) }
    }

    async fn send(&self, channel: u64, report: &Report<'_>) -> Result<(), DeliveryError> {
        // The answer replaces the turn's status message.
        self.shared.progress.finish(channel).await;
        let mut chunks = split(report.text, MAX_CONTENT);
        if chunks.is_empty() {
            chunks.push("(empty message)".into());
        }
        let buttons = report.job.filter(|j| j.reminder).map(|j| components(&j.id));
        let n = chunks.len();
        for (i, chunk) in chunks.iter().enumerate() {
            let mut body = json!({"content": chunk, "allowed_mentions": {"parse": []}});
            if let (true, Some(b)) = (i + 1 == n, &buttons) {
                body["components"] = b.clone();
            }
            // Parts already sent are sent again on retry: at-least-once, like every target.
            self.shared.rest.create_message(channel, &body).await.map_err(delivery_error)?;
        }
        for path in report.attach {
            self.send_file(channel, path).await?;
        }
        Ok(())
    }

    /// One attachment; one that cannot be read is named in a message instead.
    async fn send_file(&self, channel: u64, path: &str) -> Result<(), DeliveryError> {
        let (ws, p) = (self.workspace.clone(), path.to_string());
        let data = match crate::util::tasks::blocking(move || ws.read_all(&p, MAX_UPLOAD)).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(path, error = %e, "an attachment cannot be read; telling the channel");
                let note = json!({"content": cut(&format!("(The file {path} could not be sent: {e})"), MAX_CONTENT),
                                  "allowed_mentions": {"parse": []}});
                return self.shared.rest.create_message(channel, &note).await.map(drop).map_err(delivery_error);
            }
        };
        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
        let file = FilePart { name: &name, mime: crate::channels::inbox::mime_of(&name), data: &data };
        let body = json!({"allowed_mentions": {"parse": []}});
        self.shared.rest.create_message_with_file(channel, &body, file).await.map(drop).map_err(delivery_error)
    }
}

impl Channel for DiscordChannel {
    fn name(&self) -> &'static str {
        "discord"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { files: true, buttons: true, edits: true, typing: true }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Discord(channel) => self.send(*channel, &report).await,
                other => Err(DeliveryError::permanent(format!("the discord channel cannot deliver to {other}"))),
            }
        })
    }
}

/// Done · 10 min · 1 h · Tomorrow, as an action row of buttons (component types 1 and 2).
pub fn components(job: &str) -> Value {
    let b = |label: &str, style: u8, action: &str| json!({"type": 2, "style": style, "label": label, "custom_id": format!("r:{action}:{job}")});
    json!([{"type": 1, "components": [
        b("✅ Done", 3, "d"), b("💤 10 min", 2, "s10"), b("1 h", 2, "s60"), b("Tomorrow", 2, "t")
    ]}])
}

fn delivery_error(e: DiscordError) -> DeliveryError {
    match e.status() {
        // Refused as malformed or too large: this report's own doing.
        Some(400 | 413) => DeliveryError::suspect(e.to_string()),
        _ if e.is_retryable() => DeliveryError::retryable(e.to_string()),
        // 403 Missing Access, 404 Unknown Channel: trying again will not help.
        _ => DeliveryError::permanent(e.to_string()),
    }
}

/// `text` in parts of at most `max` characters, cut at a line break when one is near.
pub fn split(text: &str, max: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text.trim_end();
    while !rest.is_empty() {
        if rest.chars().count() <= max {
            parts.push(rest.to_string());
            break;
        }
        let hard = rest.char_indices().nth(max).map_or(rest.len(), |(i, _)| i);
        let at = rest[..hard].rfind('\n').filter(|i| *i >= hard / 2).map_or(hard, |i| i + 1);
        parts.push(rest[..at].trim_end().to_string());
        rest = &rest[at..];
    }
    parts.retain(|p| !p.is_empty());
    parts
}

/// At most `max` characters (an ellipsis marks a cut).
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    format!("{}…", text.chars().take(max.saturating_sub(1)).collect::<String>())
}

/// At most `max` characters, with a note when cut (for messages that come in).
pub fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}\n[… the message was cut to {max} characters]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::telegram::buttons::{parse, Action};

    #[test]
    fn long_text_is_split_within_the_limit() {
        let text = format!("{}\n{}", "a".repeat(1500), "b".repeat(1500));
        let parts = split(&text, MAX_CONTENT);
        assert_eq!(parts, vec!["a".repeat(1500), "b".repeat(1500)]);
        let parts = split(&"é".repeat(4500), MAX_CONTENT);
        assert_eq!(parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(), vec![2000, 2000, 500]);
        assert!(split("  \n", MAX_CONTENT).is_empty());
        assert_eq!(cut("abcdef", 4), "abc…");
        assert!(cap(&"x".repeat(20), 10).contains("cut to 10 characters"));
    }

    #[test]
    fn buttons_carry_the_job_in_telegrams_format() {
        let c = components("0a1b2c3d");
        let ids: Vec<&str> =
            c[0]["components"].as_array().unwrap().iter().map(|b| b["custom_id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 4);
        assert!(ids.iter().all(|id| id.len() <= 100 && parse(id).unwrap().1 == "0a1b2c3d"));
        assert_eq!(parse(ids[0]).unwrap().0, Action::Done);
    }
}
