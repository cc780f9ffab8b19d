//! Jobs as work: the scheduler's [`JobExecutor`], which turns a due job into
//! [`Work`], runs it and reports the result.

use std::sync::Arc;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::{Runner, Work};
use crate::bus::Conversation;
use crate::delivery::Reports;
use crate::scheduler::{Job, JobExecutor, JobKind, RunOutcome};

/// Runs due jobs for the scheduler: message (an agent turn), remind (the text
/// as is), exec (a sandboxed command). Every result is a report in the outbox.
pub struct JobRunner {
    pub runner: Runner,
    pub reports: Reports,
    /// Cancelled when running work must stop (shutdown after the grace period).
    pub abort: CancellationToken,
}

impl JobRunner {
    /// Run `job` now and queue its report. Used by the daemon and `bramble cron run`.
    pub async fn run_job(&self, job: &Job) -> RunOutcome {
        let work = match &job.kind {
            JobKind::Remind { text } => Work::Text(text.clone()),
            JobKind::Message { text } => {
                // A job made in a chat answers in that chat's conversation.
                let conversation = job
                    .origin
                    .clone()
                    .unwrap_or_else(|| Conversation::new("system", job.name.clone(), format!("cron:{}", job.name)));
                Work::Turn {
                    conversation,
                    text: format!(
                        "[Scheduled job `{}` is due now. Do it and reply with the result for the user.]\n\n{text}",
                        job.name
                    ),
                    model: job.model.clone(),
                }
            }
            JobKind::Exec { command } => Work::Shell { command: command.clone(), stdin: None },
        };
        let result = self.runner.run(work, &self.abort).await;
        if self.abort.is_cancelled() {
            // Stopped by shutdown or Ctrl-C: no report; the scheduler tries a one-shot again.
            return RunOutcome::cancelled();
        }
        let (report, outcome) = match result {
            Ok(done) => (done.text.clone(), RunOutcome::ok(done.text).answered_by(done.model)),
            Err(err) => (format!("Job `{}` failed: {err}", job.name), RunOutcome::error(err)),
        };
        self.reports.send(&job.report_targets(), &report, &format!("job:{}", job.name)).await;
        outcome
    }
}

impl JobExecutor for JobRunner {
    fn execute<'a>(&'a self, job: &'a Job, _scheduled: Timestamp) -> crate::util::BoxFuture<'a, RunOutcome> {
        Box::pin(self.run_job(job))
    }
}

/// Told about every job run as it ends, with its record
/// `{"job","status","started","finished","output"}` (MQTT publishes it).
pub type RunObserver = Arc<dyn Fn(&Job, &serde_json::Value) + Send + Sync>;

/// A [`JobRunner`] whose runs are also reported to observers.
pub struct ObservedRunner {
    pub runner: JobRunner,
    pub observers: Vec<RunObserver>,
}

impl JobExecutor for ObservedRunner {
    fn execute<'a>(&'a self, job: &'a Job, _scheduled: Timestamp) -> crate::util::BoxFuture<'a, RunOutcome> {
        Box::pin(async move {
            let started = Timestamp::now();
            let outcome = self.runner.run_job(job).await;
            if !self.observers.is_empty() {
                let record = serde_json::json!({
                    "job": job.name,
                    "status": outcome.status.to_string(),
                    "started": started.to_string(),
                    "finished": Timestamp::now().to_string(),
                    "output": crate::scheduler::job::truncate(&outcome.summary, 4000),
                    "model": outcome.model,
                });
                for observe in &self.observers {
                    observe(job, &record);
                }
            }
            outcome
        })
    }
}
