//! Delivery: how a report reaches its target, durably.
//!
//! Whatever produces a report (an answer, the `message` tool, a job, the
//! heartbeat, a trigger) puts it into the [`outbox`] — a file per report
//! directory, written before anyone is told — and wakes the dispatcher
//! ([`dispatcher::run_outbox`]). The dispatcher hands it to the [`Channel`] that
//! owns its target (`telegram:<chat>`, `mqtt[:topic]`, `log`), and retries a
//! retryable failure with backoff, so a channel reports failure honestly
//! instead of retrying on its own. Nothing here knows a concrete channel but
//! [`log`], the one that is always there.

pub mod dispatcher;
pub mod log;
pub mod outbox;

use std::collections::HashMap;
use std::sync::Arc;

use crate::bus::{ReportSource, Target};
use crate::util::BoxFuture;
use log::LogChannel;

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DeliveryError {
    pub message: String,
    /// Whether trying again later may succeed (broker down, network, 429) or
    /// not (chat does not exist, bot blocked): permanent failures are dropped with a log line.
    pub retryable: bool,
    /// The failure may be this report's own doing: the other side refused it,
    /// or closed the connection while it was in flight (an MQTT broker does
    /// that to a packet it will not take). Retried, but counted: after
    /// [`outbox::MAX_REFUSALS`] such failures the report is set aside, so it
    /// cannot take the channel down after every reconnect for ever.
    pub suspect: bool,
}

impl DeliveryError {
    pub fn retryable(message: impl Into<String>) -> Self {
        DeliveryError { message: message.into(), retryable: true, suspect: false }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        DeliveryError { message: message.into(), retryable: false, suspect: false }
    }
    /// Retryable, and counted against the report ([`suspect`](Self::suspect)).
    pub fn suspect(message: impl Into<String>) -> Self {
        DeliveryError { message: message.into(), retryable: true, suspect: true }
    }
}

/// One report to deliver: where, what, and what produced it.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    pub target: &'a Target,
    pub text: &'a str,
    /// What produced it: an answer or the `message` tool, the heartbeat, an
    /// alert, a job, a trigger. A channel may route on it (MQTT publishes
    /// heartbeat reports on `<prefix>/heartbeat`).
    pub source: &'a ReportSource,
    /// The job whose report it is (Telegram adds Done / Snooze buttons).
    pub job: Option<&'a JobRef>,
    /// Workspace files sent with it (Telegram: a photo or a document; other
    /// channels name them in the text).
    pub attach: &'a [String],
    /// Its outbox id (0 outside the outbox) and when it was queued: the same
    /// on every retry, so a receiver can drop a retry's duplicate (webhooks).
    pub id: u64,
    pub created: jiff::Timestamp,
}

impl<'a> Report<'a> {
    /// A report of text only.
    pub fn text(target: &'a Target, text: &'a str, source: &'a ReportSource) -> Report<'a> {
        Report { target, text, source, job: None, attach: &[], id: 0, created: jiff::Timestamp::now() }
    }

    /// The text, with the attachments named at the end: for channels that cannot carry files.
    pub fn text_naming_files(&self) -> std::borrow::Cow<'a, str> {
        if self.attach.is_empty() {
            return self.text.into();
        }
        format!("{}\n(files in the workspace: {})", self.text, self.attach.join(", ")).into()
    }
}

/// Which job a report came from, for report buttons.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobRef {
    pub id: String,
    /// A `remind` job (its reports get buttons by default).
    #[serde(default)]
    pub reminder: bool,
}

/// One report to queue: [`Reports::send_with`] and [`outbox::Outbox::enqueue_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub target: Target,
    pub text: String,
    pub source: ReportSource,
    pub job: Option<JobRef>,
    pub attach: Vec<String>,
}

impl Outgoing {
    pub fn new(target: Target, text: impl Into<String>, source: impl Into<ReportSource>) -> Outgoing {
        Outgoing { target, text: text.into(), source: source.into(), job: None, attach: Vec::new() }
    }
}

/// Where finished work leaves its report: the outbox, and the dispatcher's
/// wake-up. One value instead of an `(Outbox, Arc<Notify>)` pair everywhere.
#[derive(Clone)]
pub struct Reports {
    outbox: outbox::Outbox,
    wake: Arc<tokio::sync::Notify>,
}

impl Reports {
    pub fn new(outbox: outbox::Outbox, wake: Arc<tokio::sync::Notify>) -> Reports {
        Reports { outbox, wake }
    }

    /// Queue `text` for every target (`source` says what produced it: the
    /// heartbeat, a job, a trigger) in one write on a blocking thread, and
    /// wake the dispatcher. A report that cannot be queued is logged as an
    /// error; the others still go.
    pub async fn send(&self, targets: &[Target], text: &str, source: ReportSource) {
        self.send_with(targets, text, source, None, &[]).await
    }

    /// [`send`](Reports::send) for a job's report: `job` rides along for the
    /// channels' buttons, `attach` names workspace files sent with it.
    pub async fn send_with(
        &self,
        targets: &[Target],
        text: &str,
        source: ReportSource,
        job: Option<JobRef>,
        attach: &[String],
    ) {
        let reports = targets
            .iter()
            .map(|t| Outgoing {
                job: job.clone(),
                attach: attach.to_vec(),
                ..Outgoing::new(t.clone(), text, source.clone())
            })
            .collect();
        let outbox = self.outbox.clone();
        let results = crate::util::tasks::blocking(move || outbox.enqueue_many(reports)).await;
        for (target, result) in targets.iter().zip(results) {
            if let Err(e) = result {
                tracing::error!(source = source.to_string(), %target, "report not queued: {e}");
            }
        }
        self.wake.notify_one();
    }

    pub fn outbox(&self) -> &outbox::Outbox {
        &self.outbox
    }

    /// The dispatcher's wake-up (notified when something new is queued).
    pub fn wake(&self) -> &Arc<tokio::sync::Notify> {
        &self.wake
    }
}

/// Publishing to a topic of the broker, acknowledged: what the `mqtt_publish`
/// tool needs of the MQTT connection. The composition root gives the tool the
/// MQTT channel's link through this, so the tool knows no channel.
pub trait Publisher: Send + Sync {
    /// Publish; Ok once the broker has it. The error is a sentence for the model.
    /// A topic bramble listens to, or one against MQTT's rules, is refused
    /// before anything is sent.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        retain: bool,
    ) -> BoxFuture<'a, Result<(), PublishFailure>>;
}

/// Why a [`Publisher`] did not publish. Its text is a sentence for the model.
#[derive(Debug, thiserror::Error)]
pub enum PublishFailure {
    /// Refused before anything was sent: a topic bramble listens to, or one
    /// against MQTT's rules.
    #[error(transparent)]
    Refused(#[from] crate::util::mqtt::TopicError),
    /// The broker did not take it (not connected, no acknowledgement in time,
    /// refused by the broker).
    #[error(transparent)]
    Broker(Box<dyn std::error::Error + Send + Sync>),
}

/// What a channel can carry beyond text. Declared by each channel, read
/// where a feature would be used: a job's Done / Snooze buttons, progress
/// shown by editing one message, files sent as files, a typing indicator.
/// Where a capability is missing the report degrades to text (files are
/// named, buttons become a line saying how to answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Files and images sent as such ([`Report::attach`]).
    pub files: bool,
    /// Buttons under a report (Done / Snooze) whose press comes back.
    pub buttons: bool,
    /// A sent message can be edited (progress of a long turn in one message).
    pub edits: bool,
    /// A typing indicator while a turn runs.
    pub typing: bool,
}

impl Capabilities {
    /// Text only: the log, MQTT, a notify service.
    pub const TEXT: Capabilities = Capabilities { files: false, buttons: false, edits: false, typing: false };
}

/// Something that can deliver text to some targets.
pub trait Channel: Send + Sync {
    /// `telegram`, `mqtt`, `log`: matches [`Target::channel`].
    fn name(&self) -> &'static str;
    /// What it can carry beyond text; text only unless a channel says more.
    fn capabilities(&self) -> Capabilities {
        Capabilities::TEXT
    }
    /// Deliver one report. Ok means the other side accepted it.
    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>>;
}

/// The channels that can deliver, by name.
#[derive(Clone, Default)]
pub struct Channels(HashMap<&'static str, Arc<dyn Channel>>);

impl Channels {
    /// The always-present `log` channel.
    pub fn with_log() -> Channels {
        let mut c = Channels::default();
        c.add(Arc::new(LogChannel));
        c
    }
    pub fn add(&mut self, ch: Arc<dyn Channel>) {
        self.0.insert(ch.name(), ch);
    }
    /// The channel for a target; the terminal target falls back to the log in the daemon.
    pub fn for_target(&self, target: &Target) -> Option<&Arc<dyn Channel>> {
        let name = match target {
            Target::Cli => "log",
            t => t.channel(),
        };
        self.0.get(name)
    }
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.0.keys().copied().collect();
        v.sort_unstable();
        v
    }
}
