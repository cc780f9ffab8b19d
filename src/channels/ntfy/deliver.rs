//! The `ntfy:<topic>` delivery target: a report as a push notification.
//!
//! The title is the job's name (or "bramble alert", "bramble heartbeat"),
//! the priority the topic's default (4 for alerts and reminders), the tags
//! the topic's plus [`OWN_TAG`], the click URL the topic's. The first
//! attachment goes with it: an `http(s)://` one by URL, a workspace file
//! uploaded (PUT); others are named in the text. A reminder gets Done /
//! Snooze buttons when `callback_base` is set ([`super::callback`]).
//!
//! Only topics named in `[ntfy]` are published to: a topic on a public
//! server is readable by anyone who guesses it, so a model's made-up topic
//! is refused (permanently, the report is dropped with a log line).
//! `429` and `5xx`, no answer and a missing token are retried by the
//! outbox; another `4xx` or a redirect is the report's end, said clearly.

use std::sync::Arc;

use super::{Shared, OWN_TAG};
use crate::bus::{ReportSource, Target};
use crate::clients::ntfy::{NtfyError, Publish};
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// ntfy's message limit is 4096 bytes; longer text is cut to this.
pub const MAX_MESSAGE_BYTES: usize = 4000;
/// An uploaded attachment at most (ntfy.sh takes 15 MB).
pub const MAX_UPLOAD: u64 = 15 * 1024 * 1024;

/// The `ntfy` delivery channel.
pub struct NtfyChannel {
    shared: Arc<Shared>,
    workspace: crate::workspace::Workspace,
}

impl NtfyChannel {
    pub fn new(shared: Arc<Shared>, workspace: &std::path::Path) -> NtfyChannel {
        NtfyChannel { shared, workspace: crate::workspace::Workspace::strict(workspace) }
    }

    /// The notification for `report` on `topic` (no buttons, no upload yet).
    pub fn notification(&self, topic: &str, report: &Report<'_>) -> Publish {
        let defaults = self.shared.cfg.topics.get(topic).cloned().unwrap_or_default();
        let reminder = report.job.is_some_and(|j| j.reminder);
        let urgent = matches!(report.source, ReportSource::Alert) || reminder;
        let title = defaults.title.clone().or_else(|| match report.source {
            ReportSource::Job(name) => Some(name.clone()),
            ReportSource::Alert => Some("bramble alert".into()),
            ReportSource::Heartbeat => Some("bramble heartbeat".into()),
            ReportSource::Trigger(label) => Some(label.clone()),
            ReportSource::Agent | ReportSource::Other(_) => None,
        });
        let mut tags = defaults.tags.clone();
        tags.push(OWN_TAG.into());
        let (first, rest) = report.attach.split_first().map_or((None, &[][..]), |(f, r)| (Some(f), r));
        let mut text = report.text.to_string();
        if !rest.is_empty() {
            text.push_str(&format!("\n(more files in the workspace: {})", rest.join(", ")));
        }
        let attach = first.filter(|a| a.starts_with("https://") || a.starts_with("http://")).cloned();
        Publish {
            topic: topic.to_string(),
            message: cut(&text, MAX_MESSAGE_BYTES),
            title,
            priority: defaults.priority.or(urgent.then_some(4)),
            tags,
            click: defaults.click.map(|c| c.0),
            attach,
            ..Default::default()
        }
    }

    async fn send(&self, topic: &str, report: Report<'_>) -> Result<(), DeliveryError> {
        let cfg = &self.shared.cfg;
        if !cfg.publishes_to(topic) {
            return Err(DeliveryError::permanent(format!(
                "ntfy:{topic} is not named in [ntfy] (topics, subscribe or alert_topic): bramble publishes only to \
                 topics you configured"
            )));
        }
        if let (Some(env), None) = (&cfg.token_env, cfg.token()) {
            return Err(DeliveryError::retryable(format!(
                "ntfy: `{env}` is not set (a variable or systemd credential); the report waits"
            )));
        }
        let mut p = self.notification(topic, &report);
        if let Some(job) = report.job.filter(|j| j.reminder && self.shared.callbacks.is_some()) {
            let (id, topic, text, now) =
                (job.id.clone(), topic.to_string(), report.text.to_string(), jiff::Timestamp::now().as_second());
            let shared = self.shared.clone();
            let actions = crate::util::tasks::blocking(move || {
                shared.callbacks.as_ref().and_then(|c| c.issue(&id, &topic, &text, now))
            })
            .await;
            p.actions = actions.unwrap_or_default();
        }
        let upload = report.attach.first().filter(|a| p.attach.is_none() && !a.contains("://"));
        let sent = match upload {
            Some(path) => {
                let (ws, path2) = (self.workspace.clone(), path.clone());
                match crate::util::tasks::blocking(move || ws.read_all(&path2, MAX_UPLOAD)).await {
                    Ok(data) => {
                        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
                        self.shared.client.upload(&p, &name, data).await
                    }
                    Err(e) => {
                        tracing::warn!(path, error = %e, "ntfy: an attachment cannot be read; sending the text");
                        p.message =
                            cut(&format!("{}\n(The file {path} could not be sent: {e})", p.message), MAX_MESSAGE_BYTES);
                        self.shared.client.publish(&p).await
                    }
                }
            }
            None => self.shared.client.publish(&p).await,
        };
        sent.map(drop).map_err(|e| classify(topic, e))
    }
}

/// Retry what may pass later; refuse what the server refused.
pub fn classify(topic: &str, e: NtfyError) -> DeliveryError {
    let retry = e.retryable();
    let text = match &e {
        NtfyError::Status { status: 401 | 403, .. } => {
            format!("ntfy:{topic}: {e} (is [ntfy] token_env's token allowed to write this topic?)")
        }
        NtfyError::Status { status: 413, .. } => format!("ntfy:{topic}: {e} (the message or file is too large)"),
        _ => format!("ntfy:{topic}: {e}"),
    };
    if retry {
        DeliveryError::retryable(text)
    } else {
        DeliveryError::permanent(text)
    }
}

/// At most `max` bytes, on a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(" […]".len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} […]", &text[..end])
}

impl Channel for NtfyChannel {
    fn name(&self) -> &'static str {
        "ntfy"
    }

    fn capabilities(&self) -> Capabilities {
        // One file a notification; buttons only where the phone can call back.
        Capabilities { files: true, buttons: self.shared.callbacks.is_some(), edits: false, typing: false }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Target::Ntfy(topic) = report.target else {
                return Err(DeliveryError::permanent(format!("`{}` is not an ntfy target", report.target)));
            };
            self.send(topic, report).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let long = "ä".repeat(3000);
        let c = cut(&long, MAX_MESSAGE_BYTES);
        assert!(c.len() <= MAX_MESSAGE_BYTES && c.ends_with("[…]"));
        assert_eq!(cut("short", 10), "short");
        assert!(!classify("t", NtfyError::Status { status: 403, body: String::new() }).retryable);
        assert!(classify("t", NtfyError::Status { status: 429, body: String::new() }).retryable);
        assert!(classify("t", NtfyError::Transport("refused".into())).retryable);
    }
}
