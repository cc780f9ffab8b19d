//! Delivery to `signal:<number|uuid|group.<id>>`: the report as plain text
//! (Signal shows no markup), its files as RFC 2397 data URIs in the same
//! `send` (signal-cli takes `data:<mime>;filename=<name>;base64,<data>` as
//! an attachment, so the daemon needs no access to bramble's workspace, nor
//! bramble to signal-cli's directory), and for a reminder a line saying how
//! to answer (react 👍 / 💤, or quote it with “done” / “snooze”); the sent
//! message's timestamp is remembered so the answer finds its job. Files that
//! come in are fetched with `getAttachment` and saved to the inbox here too.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::state::ReportEntry;
use super::Shared;
use crate::bus::{Attachment, Target};
use crate::clients::signal::SignalError;
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// What a reminder's report says under it.
pub const ANSWER_HINT: &str = "React 👍 when done or 💤 to snooze an hour (or quote it with “done” / “snooze”).";

/// Delivers reports to `signal:<chat>`.
pub struct SignalChannel {
    shared: Arc<Shared>,
    workspace: crate::workspace::Workspace,
}

impl SignalChannel {
    pub(super) fn new(shared: Arc<Shared>, workspace: &Path) -> SignalChannel {
        SignalChannel { shared, workspace: crate::workspace::Workspace::strict(workspace) }
    }

    async fn send(&self, chat: &str, report: &Report<'_>) -> Result<(), DeliveryError> {
        if !crate::bus::is_signal_chat(chat) {
            return Err(DeliveryError::permanent(format!("`{chat}` is not a Signal number, uuid or group")));
        }
        let reminder = report.job.filter(|j| j.reminder);
        let mut text =
            if report.text.trim().is_empty() { "(empty message)".to_string() } else { report.text.to_string() };
        if reminder.is_some() {
            text.push_str("\n\n");
            text.push_str(ANSWER_HINT);
        }
        let mut files = Vec::new();
        for path in report.attach {
            match self.data_uri(path).await {
                Ok(uri) => files.push(uri),
                Err(why) => text.push_str(&format!("\n\n(The file {path} could not be sent: {why})")),
            }
        }
        let timestamp = self.shared.client.send(chat, &text, files).await.map_err(delivery_error)?;
        if let Some(job) = reminder {
            let entry =
                ReportEntry { chat: chat.to_string(), timestamp, job: job.id.clone(), text: report.text.to_string() };
            let saved = self.shared.reports.lock().map(|mut r| r.add(&self.shared.state_dir, entry));
            if let Ok(Err(e)) = saved {
                tracing::warn!(error = %e, "cannot remember a Signal report; Done / Snooze on it will not work after a restart");
            }
        }
        Ok(())
    }

    /// A workspace file as a data URI with its name; `Err`: why not, in words.
    async fn data_uri(&self, path: &str) -> Result<String, String> {
        use base64::Engine as _;
        let (ws, p, cap) = (self.workspace.clone(), path.to_string(), self.shared.max_file);
        let data = crate::util::tasks::blocking(move || ws.read_all(&p, cap)).await.map_err(|e| e.to_string())?;
        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
        let mime = crate::channels::inbox::mime_of(&name);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
        Ok(format!("data:{mime};filename={name};base64,{b64}"))
    }
}

impl Channel for SignalChannel {
    fn name(&self) -> &'static str {
        "signal"
    }

    fn capabilities(&self) -> Capabilities {
        // Reactions and quoted replies answer a report (the buttons' role);
        // signal-cli cannot edit a sent message's text in place for us.
        Capabilities { files: true, buttons: true, edits: false, typing: true }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Signal(chat) => self.send(chat, &report).await,
                other => Err(DeliveryError::permanent(format!("the signal channel cannot deliver to {other}"))),
            }
        })
    }
}

/// The daemon away or a network error: retried; a refused request
/// (invalid params, an unknown recipient) is this report's own doing.
fn delivery_error(e: SignalError) -> DeliveryError {
    if e.is_retryable() {
        DeliveryError::retryable(e.to_string())
    } else {
        DeliveryError::suspect(e.to_string())
    }
}

/// Save attachment `a` (`{id, contentType, filename, size}`) of a message
/// from `from` (in `group`) to `inbox/<date>/`; `Err`: why not.
pub(super) async fn fetch(
    shared: &Shared,
    workspace: &Path,
    a: &Value,
    from: &str,
    group: Option<&str>,
) -> Result<Attachment, String> {
    let Some(id) = a["id"].as_str().filter(|i| !i.is_empty()) else { return Err("it has no id".into()) };
    if a["size"].as_u64().is_some_and(|s| s > shared.max_file) {
        return Err(format!("it is larger than [signal] max_file_mb ({} bytes)", shared.max_file));
    }
    let data = shared.client.attachment(id, from, group).await.map_err(|e| e.to_string())?;
    if data.len() as u64 > shared.max_file {
        return Err(format!("it is larger than [signal] max_file_mb ({} bytes)", shared.max_file));
    }
    let mime = a["contentType"].as_str().unwrap_or("application/octet-stream").to_string();
    let name = crate::channels::inbox::safe_name(a["filename"].as_str().unwrap_or(id));
    let ws = crate::workspace::Workspace::strict(workspace);
    let size = data.len() as u64;
    let path = crate::util::tasks::blocking(move || crate::channels::inbox::save_new(&ws, &name, &data))
        .await
        .map_err(|e| format!("cannot save it in the workspace inbox: {e}"))?;
    tracing::info!(path, size, "Signal file saved to the inbox");
    Ok(Attachment { kind: super::inbound::kind_of(&mime), path, mime, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_this_reports_and_outages_are_retried() {
        let refused = SignalError::Rpc { method: "send".into(), code: -32602, message: "bad".into() };
        assert!(!delivery_error(refused).to_string().is_empty());
        assert!(SignalError::Transport("x".into()).is_retryable());
        assert_eq!(crate::channels::inbox::mime_of("a.PNG"), "image/png");
    }
}
