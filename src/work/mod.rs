//! Work: what runs without someone waiting at a chat — a due job, a heartbeat
//! tick, an MQTT trigger, `bramble cron run` — and the one path from "run it"
//! to "its report is in the outbox".
//!
//! [`Work`] says what to do: an agent turn, a sandboxed shell command, or a
//! fixed text (a reminder). [`Runner::run`] does it, counted as work in flight
//! (shutdown waits for it) and interruptible; the caller hands the result to
//! [`crate::delivery::Reports`]. The scheduler's executor ([`jobs`]), the
//! heartbeat ([`heartbeat_loop`]) and the MQTT and Home Assistant triggers
//! ([`firing`]: what a firing does, shared) are thin adapters over this, so
//! a new kind of work (a watcher, an alert) plugs in here.
//!
//! Above the agent, below the channels (see `ARCHITECTURE.md`, "Layers").

pub mod alerts;
pub mod firing;
pub mod heartbeat_loop;
pub mod jobs;
pub mod reminders;

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, TurnRequest};
use crate::bus::{Conversation, Principal};
use crate::config::ExecConfig;
use crate::sandbox::Sandbox;

/// One piece of work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// An agent turn in a session (as a job: tools that would schedule more
    /// work refuse), on `model` if given (`provider/model`, a job's `--model`),
    /// acting for `principal` (a job's creator: its tools stay within theirs).
    Turn { conversation: Conversation, text: String, model: Option<String>, principal: Principal },
    /// A command in the sandbox, as the `exec` tool runs it, with `stdin` if given.
    Shell { command: String, stdin: Option<Vec<u8>> },
    /// A text as it is (a reminder).
    Text(String),
}

/// What finished work produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The text to report.
    pub text: String,
    /// Which model answered (`provider/model`; for turns only).
    pub model: Option<String>,
}

impl Done {
    fn text(text: String) -> Done {
        Done { text, model: None }
    }
}

/// Why work produced no text to report. The message is what its report says
/// (`Job `x` failed: <this>`).
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// Stopped by its `cancel` (shutdown, Ctrl-C): nothing is reported.
    #[error("the work was stopped")]
    Cancelled,
    /// The agent's turn failed.
    #[error(transparent)]
    Turn(crate::agent::TurnError),
    /// The command ran and failed: its output, as the `exec` tool renders it.
    #[error("{0}")]
    Shell(String),
    /// The command could not be run in the sandbox.
    #[error(transparent)]
    Exec(std::io::Error),
}

/// Runs [`Work`]: the agent for turns, the sandbox for commands.
#[derive(Clone)]
pub struct Runner {
    agent: Arc<Agent>,
    exec: ExecConfig,
    workspace: PathBuf,
    /// Where commands run (the composition root's, shared with the exec tool).
    sandbox: Arc<Sandbox>,
}

impl Runner {
    pub fn new(agent: Arc<Agent>, exec: ExecConfig, workspace: PathBuf, sandbox: Arc<Sandbox>) -> Runner {
        Runner { agent, exec, workspace, sandbox }
    }

    /// Count what the caller does next as work in flight (shutdown waits for
    /// it), for the steps before [`run`](Self::run) counts by itself.
    pub fn busy(&self) -> crate::agent::InFlightGuard {
        self.agent.inflight().enter()
    }

    /// Run a watcher's command in the sandbox, counted as work in flight.
    pub async fn watch(
        &self,
        command: &str,
        cancel: &CancellationToken,
    ) -> Result<crate::tools::exec::ShellOutput, WorkError> {
        let _busy = self.agent.inflight().enter();
        let out =
            crate::tools::exec::run_shell_output(&self.sandbox, &self.exec, &self.workspace, command, None, cancel)
                .await;
        if cancel.is_cancelled() {
            return Err(WorkError::Cancelled);
        }
        out.map_err(WorkError::Exec)
    }

    /// Do `work`; the text to report, or why it failed. Counted in the agent's
    /// work in flight; `cancel` interrupts it, and then it is
    /// [`WorkError::Cancelled`] whatever it did (the caller reports nothing).
    pub async fn run(&self, work: Work, cancel: &CancellationToken) -> Result<Done, WorkError> {
        let _busy = self.agent.inflight().enter();
        let result = self.run_uncounted(work, cancel).await;
        if cancel.is_cancelled() {
            return Err(WorkError::Cancelled);
        }
        result
    }

    async fn run_uncounted(&self, work: Work, cancel: &CancellationToken) -> Result<Done, WorkError> {
        match work {
            Work::Text(text) => Ok(Done::text(text)),
            Work::Turn { conversation, text, model, principal } => {
                let req = TurnRequest {
                    principal,
                    conversation,
                    text,
                    in_job: true,
                    model,
                    cancel: cancel.child_token(),
                    attachments: Vec::new(),
                };
                match self.agent.turn(req).await {
                    Ok(r) => Ok(Done { text: r.text, model: r.route.map(|r| r.label()) }),
                    Err(crate::agent::TurnError::Cancelled) => Err(WorkError::Cancelled),
                    Err(e) => Err(WorkError::Turn(e)),
                }
            }
            Work::Shell { command, stdin } => {
                match crate::tools::exec::run_shell(&self.sandbox, &self.exec, &self.workspace, &command, stdin, cancel)
                    .await
                {
                    Ok((true, text)) => Ok(Done::text(text)),
                    Ok((false, text)) => Err(WorkError::Shell(text)),
                    Err(e) => Err(WorkError::Exec(e)),
                }
            }
        }
    }
}
