//! The daemon (`bramble run`): wires the scheduler, the heartbeat, the agent,
//! the channels and the outbox together, and owns their lifecycle.
//!
//! Lifecycle: load config → start every component with a child of one
//! cancellation token → run until SIGINT/SIGTERM (stop) or SIGHUP (reload:
//! stop gracefully, load the config again, start again; a config with errors
//! is reported and the running one kept). Turns in flight get
//! [`SHUTDOWN_GRACE`] to finish; state is written as it changes, so there is
//! nothing left to flush.
//!
//! Without a config file the daemon still runs with defaults and says what is
//! not configured: no provider means LLM jobs fail with that reason, while
//! reminders and exec jobs still run.

pub mod outbox;
pub mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, TurnRequest};
use crate::bus::{Target, OutboundMessage};
use crate::channels::{log::LogChannel, Channel};
use crate::config::{HeartbeatConfig, TzName};
use crate::scheduler::heartbeat::{self, Decision, HeartbeatState, StateFile};
use outbox::{Attempt, Outbox};

/// How long running turns may take to finish on shutdown or reload.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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

/// Deliver due outbox entries until cancelled. Wakes when `wake` is notified
/// (a new entry) or when the earliest backoff ends — not on a fixed tick.
pub async fn run_outbox(outbox: Outbox, channels: Channels, wake: Arc<Notify>, cancel: CancellationToken) {
    // Warn once per missing channel, not once per attempt.
    let mut warned: Vec<&'static str> = Vec::new();
    loop {
        let now = Timestamp::now();
        match outbox.due(now) {
            Ok(due) => {
                for entry in due {
                    let attempt = match channels.for_target(&entry.target) {
                        None => {
                            let name = entry.target.channel();
                            if !warned.contains(&name) {
                                warned.push(name);
                                tracing::warn!(
                                    target = %entry.target,
                                    "no `{name}` channel is configured: reports for it wait in the outbox"
                                );
                            }
                            Attempt::Retry(format!("the {name} channel is not configured"))
                        }
                        Some(ch) => match ch.deliver(&entry.target, &entry.text).await {
                            Ok(()) => Attempt::Delivered,
                            Err(e) if e.retryable => {
                                tracing::warn!(target = %entry.target, attempt = entry.attempts + 1, error = %e, "delivery failed; will retry");
                                Attempt::Retry(e.message)
                            }
                            Err(e) => {
                                tracing::error!(target = %entry.target, error = %e, "delivery refused; report dropped");
                                Attempt::Drop(e.message)
                            }
                        },
                    };
                    if let Err(e) = outbox.record(entry.id, attempt, Timestamp::now()) {
                        tracing::error!("{e}");
                    }
                }
            }
            Err(e) => tracing::error!("{e}"),
        }
        let sleep = match outbox.next_due() {
            Ok(Some(t)) => Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO),
            _ => Duration::from_secs(3600),
        }
        .clamp(Duration::from_millis(50), Duration::from_secs(3600));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = wake.notified() => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// Move messages the agent sends (answers, the `message` tool) into the outbox.
pub async fn pump_outbound(
    mut rx: mpsc::Receiver<OutboundMessage>,
    outbox: Outbox,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => return },
            _ = cancel.cancelled() => return,
        };
        match outbox.enqueue(msg.target, &msg.text, "agent") {
            Ok(_) => wake.notify_one(),
            Err(e) => tracing::error!("a message could not be queued: {e}"),
        }
    }
}

/// What one heartbeat tick did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// No active tasks: no LLM call was made.
    NoTasks,
    /// Inside quiet hours: skipped.
    Quiet,
    /// `--dry-run`: the message that would be sent.
    DryRun(String),
    /// The agent had nothing to report (HEARTBEAT_OK): nothing delivered.
    NothingToReport,
    /// A report was queued for these targets.
    Reported { text: String, targets: Vec<Target> },
    /// The turn failed; the reason was queued as the report.
    Failed(String),
}

/// Everything a heartbeat tick needs.
#[derive(Clone)]
pub struct Heartbeat {
    pub config: HeartbeatConfig,
    pub workspace: PathBuf,
    pub tz: TzName,
    pub state: StateFile,
    pub outbox: Outbox,
    pub wake: Arc<Notify>,
}

impl Heartbeat {
    /// Run one tick now.
    pub async fn tick(&self, agent: &Agent, dry_run: bool, cancel: &CancellationToken) -> HeartbeatOutcome {
        let file = std::fs::read_to_string(self.workspace.join("HEARTBEAT.md")).ok();
        let local = Timestamp::now().to_zoned(self.tz.tz().clone());
        let tasks = match heartbeat::decide(file.as_deref(), self.config.quiet_hours, &local) {
            Decision::NoTasks => return HeartbeatOutcome::NoTasks,
            Decision::Quiet => return HeartbeatOutcome::Quiet,
            Decision::Run(tasks) => tasks,
        };
        let prompt = heartbeat::prompt(&tasks, &local);
        if dry_run {
            return HeartbeatOutcome::DryRun(prompt);
        }
        let req = TurnRequest {
            session_key: "heartbeat".into(),
            channel: "system".into(),
            chat_id: "heartbeat".into(),
            text: prompt,
            in_job: true,
            cancel: cancel.child_token(),
        };
        let (status, outcome) = match agent.turn(req).await {
            Ok(r) if heartbeat::is_ok_reply(&r.text) => ("ok", HeartbeatOutcome::NothingToReport),
            Ok(r) => ("reported", HeartbeatOutcome::Reported { text: r.text, targets: self.config.deliver.clone() }),
            Err(e) => ("error", HeartbeatOutcome::Failed(format!("The heartbeat could not run: {e}"))),
        };
        let report = match &outcome {
            HeartbeatOutcome::Reported { text, .. } | HeartbeatOutcome::Failed(text) => Some(text.clone()),
            _ => None,
        };
        if let Some(text) = report {
            for target in &self.config.deliver {
                if let Err(e) = self.outbox.enqueue(target.clone(), &text, "heartbeat") {
                    tracing::error!("heartbeat report not queued: {e}");
                }
            }
            self.wake.notify_one();
        }
        let saved = HeartbeatState { last_run: Some(Timestamp::now()), last_status: Some(status.into()) };
        if let Err(e) = self.state.save(&saved) {
            tracing::error!("cannot save the heartbeat state: {e}");
        }
        tracing::info!(status, "heartbeat ran");
        outcome
    }

    /// Tick every `every`, anchored on the last run that called the model
    /// (persisted), so restarts do not reset the interval.
    pub async fn run(self, agent: Arc<Agent>, cancel: CancellationToken) {
        if !self.config.enabled {
            tracing::info!("heartbeat disabled");
            return;
        }
        let every = self.config.every.get().max(Duration::from_secs(10));
        let mut anchor = self.state.load().last_run;
        loop {
            let now = Timestamp::now();
            let due = heartbeat::next_due(anchor, every, now);
            let wait = Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return,
            }
            let outcome = self.tick(&agent, false, &cancel).await;
            tracing::debug!(?outcome, "heartbeat tick");
            anchor = Some(Timestamp::now());
        }
    }
}
