//! The heartbeat's runtime: every `[heartbeat] every`, read `HEARTBEAT.md`,
//! and when it lists active tasks (outside quiet hours) run one agent turn on
//! them; the turn decides by calling `report(text)` or `nothing_to_report()`
//! ([`Agent::decide`]), and a text reply other than `HEARTBEAT_OK` is a report. What the file means is
//! decided in [`crate::scheduler::heartbeat`]; this is the part that runs it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, TurnEnd, TurnRequest};
use crate::bus::{Conversation, Target};
use crate::config::{HeartbeatConfig, TzName};
use crate::delivery::Reports;
use crate::scheduler::heartbeat::{self, Decision, HeartbeatState, StateFile};
use crate::util::pulse::Pulse;

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
    /// Interrupted by shutdown: nothing reported, the tick is not counted.
    Cancelled,
}

/// Everything a heartbeat tick needs.
#[derive(Clone)]
pub struct Heartbeat {
    pub config: HeartbeatConfig,
    pub workspace: PathBuf,
    pub tz: TzName,
    pub state: StateFile,
    pub reports: Reports,
    /// Beaten when the loop starts and after every tick: the dead-man's view.
    pub pulse: Pulse,
}

/// The daemon's heartbeat loop ([`Heartbeat::run`]) for `agent`: the stop
/// ends it between ticks, the abort interrupts a tick. Cheap to clone: the
/// daemon makes it again if it ever ends (it anchors on the persisted last run).
#[derive(Clone)]
pub struct HeartbeatLoop {
    pub heartbeat: Heartbeat,
    pub agent: Arc<Agent>,
}

impl HeartbeatLoop {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (stop, abort) = (shutdown.stop_token().clone(), shutdown.abort_token().clone());
        self.heartbeat.run(self.agent, stop, abort).await
    }
}

impl Heartbeat {
    /// Run one tick now. `cancel` interrupts the turn.
    pub async fn tick(&self, agent: &Agent, dry_run: bool, cancel: &CancellationToken) -> HeartbeatOutcome {
        let workspace = self.workspace.clone();
        let file = tokio::task::spawn_blocking(move || heartbeat::read_file(&workspace)).await.ok().flatten();
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
            model: None,
            conversation: Conversation::new(crate::bus::Channel::System, "heartbeat", "heartbeat"),
            text: prompt,
            in_job: true,
            cancel: cancel.child_token(),
            attachments: Vec::new(),
            principal: crate::bus::Principal::Owner,
        };
        // The decision is a call of `report` or `nothing_to_report`; a text answer still counts (`HEARTBEAT_OK`).
        let (status, outcome) = match agent.decide(req, heartbeat::HEARTBEAT_OK).await {
            Err(crate::agent::TurnError::Cancelled) => return HeartbeatOutcome::Cancelled,
            Ok(r) if r.end == TurnEnd::NothingToReport || heartbeat::is_ok_reply(&r.text) => {
                ("ok", HeartbeatOutcome::NothingToReport)
            }
            Ok(r) => ("reported", HeartbeatOutcome::Reported { text: r.text, targets: self.config.deliver.clone() }),
            Err(e) => ("error", HeartbeatOutcome::Failed(format!("The heartbeat could not run: {e}"))),
        };
        let report = match &outcome {
            HeartbeatOutcome::Reported { text, .. } | HeartbeatOutcome::Failed(text) => Some(text.clone()),
            _ => None,
        };
        if let Some(text) = report {
            self.reports.send(&self.config.deliver, &text, crate::bus::ReportSource::Heartbeat).await;
        }
        let saved = HeartbeatState { last_run: Some(Timestamp::now()), last_status: Some(status.into()) };
        if let Err(e) = self.state.save(&saved) {
            tracing::error!("cannot save the heartbeat state: {e}");
        }
        tracing::info!(status, "heartbeat ran");
        outcome
    }

    /// Tick every `every`, anchored on the last run that called the model
    /// (persisted), so restarts do not reset the interval. `stop` ends the
    /// loop between ticks; `abort` interrupts a tick in progress.
    pub async fn run(self, agent: Arc<Agent>, stop: CancellationToken, abort: CancellationToken) {
        if !self.config.enabled {
            tracing::info!("heartbeat disabled");
            return;
        }
        let every = self.config.every.get().max(Duration::from_secs(10));
        let mut anchor = self.state.load().last_run;
        self.pulse.beat();
        loop {
            let now = Timestamp::now();
            // A last run "in the future" means the clock was wrong (a board
            // without RTC before NTP sync): treat it as due now.
            if anchor.is_some_and(|a| a > now) {
                anchor = None;
            }
            let due = heartbeat::next_due(anchor, every, now);
            // Sleep in steps of at most ten minutes: the wall clock may jump
            // meanwhile (NTP after boot), and the anchor is wall time.
            let wait = Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO);
            if !wait.is_zero() {
                tracing::debug!(in_secs = wait.as_secs(), "heartbeat waiting");
                tokio::select! {
                    _ = crate::util::timer::sleep(wait.min(Duration::from_secs(600))) => continue,
                    _ = stop.cancelled() => return,
                }
            }
            if stop.is_cancelled() {
                return;
            }
            // The turn counts itself as work in flight (see `Agent::inflight`).
            let outcome = self.tick(&agent, false, &abort).await;
            self.pulse.beat();
            tracing::debug!(?outcome, "heartbeat tick");
            if outcome == HeartbeatOutcome::Cancelled {
                return;
            }
            anchor = Some(Timestamp::now());
        }
    }
}
