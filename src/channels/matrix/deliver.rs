//! Delivery to `matrix:<room>`: the report as `m.text` with an HTML body
//! (`org.matrix.custom.html`), its files uploaded to the media repository
//! and posted as `m.image` / `m.file`, and for a reminder a line saying how
//! to answer (react ✅ / ⏰, or reply `done` / `snooze`); the report's event
//! is remembered so the answer finds its job. Files that come in are saved
//! to the workspace inbox here too ([`fetch`]): the same media repository.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::json;

use super::state::ReportEntry;
use super::Shared;
use crate::bus::{Attachment, AttachmentKind, Target};
use crate::clients::matrix::{Event, MatrixError};
use crate::config::MatrixConfig;
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// The largest file uploaded with a report.
const MAX_UPLOAD: u64 = 50 * 1024 * 1024;
/// What a reminder's report says under it.
pub const ANSWER_HINT: &str = "React ✅ when done or ⏰ to snooze an hour (or reply “done” / “snooze”).";

/// Delivers reports to `matrix:<room>`.
pub struct MatrixChannel {
    shared: Arc<Shared>,
    workspace: crate::workspace::Workspace,
}

impl MatrixChannel {
    pub(super) fn new(shared: Arc<Shared>, workspace: &Path) -> MatrixChannel {
        MatrixChannel { shared, workspace: crate::workspace::Workspace::strict(workspace) }
    }

    /// The room id of `room` (an alias is resolved once and remembered).
    async fn room_id(&self, room: &str) -> Result<String, DeliveryError> {
        if !room.starts_with('#') {
            return Ok(room.to_string());
        }
        if let Some(id) = self.shared.aliases.lock().ok().and_then(|a| a.get(room).cloned()) {
            return Ok(id);
        }
        let id = self.shared.client.resolve_alias(room).await.map_err(delivery_error)?;
        if let Ok(mut a) = self.shared.aliases.lock() {
            a.insert(room.to_string(), id.clone());
        }
        Ok(id)
    }

    async fn send(&self, room: &str, report: &Report<'_>) -> Result<(), DeliveryError> {
        if !crate::bus::is_matrix_room(room) {
            return Err(DeliveryError::permanent(format!("`{room}` is not a Matrix room id or alias")));
        }
        let room = self.room_id(room).await?;
        // The answer replaces the turn's status notice.
        super::progress::finish(&self.shared, &room).await;
        let reminder = report.job.filter(|j| j.reminder);
        let mut text =
            if report.text.trim().is_empty() { "(empty message)".to_string() } else { report.text.to_string() };
        if reminder.is_some() {
            text.push_str("\n\n");
            text.push_str(ANSWER_HINT);
        }
        let content = json!({
            "msgtype": "m.text",
            "body": text,
            "format": "org.matrix.custom.html",
            "formatted_body": to_html(&text),
        });
        let event_id = self
            .shared
            .client
            .send(&room, "m.room.message", &self.shared.txn(), &content)
            .await
            .map_err(delivery_error)?;
        if let Some(job) = reminder {
            let entry =
                ReportEntry { event_id, room: room.clone(), job: job.id.clone(), text: report.text.to_string() };
            let saved = self.shared.reports.lock().map(|mut r| r.add(&self.shared.state_dir, entry));
            if let Ok(Err(e)) = saved {
                tracing::warn!(error = %e, "cannot remember a Matrix report; Done / Snooze on it will not work after a restart");
            }
        }
        for path in report.attach {
            self.send_file(&room, path).await?;
        }
        Ok(())
    }

    /// One attachment: uploaded, then posted as an image or a file.
    async fn send_file(&self, room: &str, path: &str) -> Result<(), DeliveryError> {
        let (ws, p) = (self.workspace.clone(), path.to_string());
        let data = match crate::util::tasks::blocking(move || ws.read_all(&p, MAX_UPLOAD)).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(path, error = %e, "an attachment cannot be read; telling the room");
                let note = json!({"msgtype": "m.notice", "body": format!("(The file {path} could not be sent: {e})")});
                return self
                    .shared
                    .client
                    .send(room, "m.room.message", &self.shared.txn(), &note)
                    .await
                    .map(drop)
                    .map_err(delivery_error);
            }
        };
        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
        let mime = crate::channels::inbox::mime_of(&name);
        let size = data.len();
        let uri = self.shared.client.upload(&name, mime, data).await.map_err(delivery_error)?;
        let msgtype = if mime.starts_with("image/") { "m.image" } else { "m.file" };
        let content = json!({"msgtype": msgtype, "body": name, "url": uri, "info": {"mimetype": mime, "size": size}});
        self.shared
            .client
            .send(room, "m.room.message", &self.shared.txn(), &content)
            .await
            .map(drop)
            .map_err(delivery_error)
    }
}

impl Channel for MatrixChannel {
    fn name(&self) -> &'static str {
        "matrix"
    }

    fn capabilities(&self) -> Capabilities {
        // Reactions and replies answer a report (buttons); a status notice edited with `m.replace`.
        Capabilities { files: true, buttons: true, edits: true, typing: true }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Matrix(room) => self.send(room, &report).await,
                other => Err(DeliveryError::permanent(format!("the matrix channel cannot deliver to {other}"))),
            }
        })
    }
}

/// A transaction id unique to this process's sends (the homeserver
/// de-duplicates a retried request with the same id); `counter` is the channel's.
pub fn txn_id(counter: &AtomicU64) -> String {
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("bramble.{t}.{n}")
}

fn delivery_error(e: MatrixError) -> DeliveryError {
    match e.code() {
        // Too large or refused as malformed: this report's own doing.
        Some(400 | 413) => DeliveryError::suspect(e.to_string()),
        _ if e.is_retryable() => DeliveryError::retryable(e.to_string()),
        _ => DeliveryError::permanent(e.to_string()),
    }
}

/// Markdown → Matrix HTML: Telegram's converter (the same tags Matrix
/// clients show), with line breaks outside `<pre>` as `<br>`.
pub fn to_html(markdown: &str) -> String {
    let html = crate::channels::telegram::format::to_html_chunks(markdown, usize::MAX / 2).concat();
    let mut out = String::with_capacity(html.len() + 64);
    let mut in_pre = false;
    let mut rest = html.as_str();
    while let Some(i) = rest.find(['\n', '<']) {
        out.push_str(&rest[..i]);
        if rest[i..].starts_with('\n') {
            out.push_str(if in_pre { "\n" } else { "<br>" });
            rest = &rest[i + 1..];
        } else {
            in_pre = if rest[i..].starts_with("<pre") {
                true
            } else if rest[i..].starts_with("</pre") {
                false
            } else {
                in_pre
            };
            out.push('<');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// Save the file of message `e` (`m.image`, `m.file`, …) to `inbox/<date>/`
/// of the workspace; `Err`: why not, in words for the sender.
pub(super) async fn fetch(
    shared: &Shared,
    workspace: &Path,
    cfg: &MatrixConfig,
    e: &Event,
) -> Result<Attachment, String> {
    let c = &e.content;
    let Some(url) = c["url"].as_str() else {
        return Err("it has no plain URL (an encrypted file?)".into());
    };
    let cap = cfg.max_file_mb * 1024 * 1024;
    if c["info"]["size"].as_u64().is_some_and(|s| s > cap) {
        return Err(format!("it is larger than [matrix] max_file_mb ({} MB)", cfg.max_file_mb));
    }
    let data = shared.client.download(url, cap).await.map_err(|e| e.to_string())?;
    let mime = c["info"]["mimetype"].as_str().unwrap_or("application/octet-stream").to_string();
    let kind = match c["msgtype"].as_str() {
        Some("m.image") => AttachmentKind::Image,
        _ => AttachmentKind::File,
    };
    let raw = c["filename"].as_str().or(c["body"].as_str()).unwrap_or("file");
    let name = crate::channels::inbox::safe_name(raw);
    let ws = crate::workspace::Workspace::strict(workspace);
    let size = data.len() as u64;
    let path = crate::util::tasks::blocking(move || crate::channels::inbox::save_new(&ws, &name, &data))
        .await
        .map_err(|e| format!("cannot save it in the workspace inbox: {e}"))?;
    tracing::info!(path, size, "Matrix file saved to the inbox");
    Ok(Attachment { kind, path, mime, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_keeps_lines_and_code() {
        let h = to_html("**Hi**\nthere\n\n```\na\nb\n```");
        assert!(h.contains("<b>Hi</b><br>there"), "{h}");
        assert!(h.contains("a\nb"), "code keeps its newlines: {h}");
    }

    #[test]
    fn txn_ids_differ() {
        let c = AtomicU64::new(0);
        assert_ne!(txn_id(&c), txn_id(&c));
    }
}
