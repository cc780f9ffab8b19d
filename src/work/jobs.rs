//! Jobs as work: the scheduler's [`JobExecutor`], which turns a due job into
//! [`Work`], runs it and reports the result.

use std::sync::Arc;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::alerts::{job_key, Alerts};
use super::{Runner, Work, WorkError};
use crate::bus::Conversation;
use crate::delivery::Reports;
use crate::policy::Standing;
use crate::scheduler::{Incident, Job, JobExecutor, JobKind, RunOutcome, RunStatus, Watch, WatchMode, WatchSeen};

/// Runs due jobs for the scheduler: message (an agent turn), remind (the text
/// as is), exec (a sandboxed command). Every result is a report in the outbox.
pub struct JobRunner {
    pub runner: Runner,
    pub reports: Reports,
    /// Cancelled when running work must stop (shutdown after the grace period).
    pub abort: CancellationToken,
    /// `[alerts]`: a job failing in a row, a one-shot given up, missed runs.
    pub alerts: Alerts,
    /// Whether a job's creator may still have it run (checked at every run).
    pub standing: Standing,
}

impl JobRunner {
    /// Run `job` now and queue its report. A job that has now failed
    /// `[alerts] after_failures` times in a row raises its alert (once: the
    /// condition stays open, across restarts, until a good run clears it
    /// with a recovery note). Used by the daemon and `bramble cron run`.
    pub async fn run_job(&self, job: &Job) -> RunOutcome {
        // Counted from here: a stop that comes while the creator's standing is
        // read (off the runtime thread) waits for the run like any other.
        let _busy = self.runner.busy();
        if let Err(why) = self.creator_may_run(job).await {
            // Nothing runs and nothing is reported: the creator's chat may be
            // the very one that lost its rights. The owner finds it in the log
            // and in `bramble cron list` (disabled).
            tracing::warn!(job = %job.name, creator = %job.made_by(), "job not run and disabled: {why}");
            return RunOutcome::refused(format!("not run and disabled: {why}"));
        }
        let outcome = self.run_once(job).await;
        let (after, before) = (self.alerts.config().after_failures.max(1), job.state.failures);
        let key = job_key(&job.id);
        match outcome.status {
            RunStatus::Error if before + 1 >= after => {
                let text = format!(
                    "Alert: job `{}` has failed {} time{} in a row. Last error: {}",
                    job.name,
                    before + 1,
                    if before == 0 { "" } else { "s" },
                    crate::scheduler::job::truncate(outcome.error.as_deref().unwrap_or(&outcome.summary), 500)
                );
                self.alerts.raise(&key, text).await;
            }
            RunStatus::Ok => {
                let name = job.name.clone();
                self.alerts
                    .clear(&key, move |_| {
                        if before > 0 {
                            format!("Recovered: job `{name}` works again after {before} failed runs in a row.")
                        } else {
                            format!("Recovered: job `{name}` ran again and worked.")
                        }
                    })
                    .await;
            }
            _ => {}
        }
        outcome
    }

    /// [`Standing::check`], off the runtime thread (it reads the paired users).
    async fn creator_may_run(&self, job: &Job) -> Result<(), crate::policy::standing::StandingError> {
        let (standing, job) = (self.standing.clone(), job.clone());
        crate::util::tasks::blocking(move || standing.check(&job)).await
    }

    async fn run_once(&self, job: &Job) -> RunOutcome {
        let mut seen = None;
        let work = match &job.kind {
            JobKind::Remind { text } => Work::Text(text.clone()),
            JobKind::Message { text } => {
                let text = match &job.watch {
                    None => text.clone(),
                    Some(watch) => match self.watch(job, watch).await {
                        Watched::Quiet(outcome) => return outcome,
                        Watched::Fire { text: fired, seen: now } => {
                            seen = now;
                            fill(text, &fired.output, fired.previous.as_deref())
                        }
                    },
                };
                // A job made in a chat answers in that chat's conversation.
                let conversation = job.origin.clone().unwrap_or_else(|| {
                    Conversation::new(crate::bus::Channel::System, job.name.clone(), format!("cron:{}", job.name))
                });
                Work::Turn {
                    conversation,
                    text: format!(
                        "[Scheduled job `{}` is due now. Do it and reply with the result for the user.]\n\n{text}",
                        job.name
                    ),
                    model: job.model.clone(),
                    principal: job.made_by(),
                }
            }
            JobKind::Exec { command } => Work::Shell { command: command.clone(), stdin: None },
        };
        let (report, outcome, ok) = match self.runner.run(work, &self.abort).await {
            // Stopped by shutdown or Ctrl-C: no report; the scheduler tries a one-shot again.
            Err(WorkError::Cancelled) => return RunOutcome::cancelled(),
            Ok(done) => (done.text.clone(), RunOutcome::ok(done.text).answered_by(done.model), true),
            Err(err) => (format!("Job `{}` failed: {err}", job.name), RunOutcome::error(err.to_string()), false),
        };
        // A report can carry Done / Snooze buttons (Telegram): it says which job it is.
        let job_ref = ok.then(|| crate::delivery::JobRef {
            id: job.id.clone(),
            reminder: matches!(job.kind, JobKind::Remind { .. }),
        });
        let attach = if ok { job.attach.as_slice() } else { &[] };
        self.reports
            .send_with(&job.report_targets(), &report, crate::bus::ReportSource::Job(job.name.clone()), job_ref, attach)
            .await;
        outcome.watched(seen)
    }

    /// Run a watcher's command and decide. Quiet runs cost no model call and
    /// send no report; a failing command is reported once (not at every poll)
    /// unless failing is what is watched for.
    async fn watch(&self, job: &Job, watch: &Watch) -> Watched {
        let out = match self.runner.watch(&watch.command, &self.abort).await {
            Ok(out) => out,
            Err(WorkError::Cancelled) => return Watched::Quiet(RunOutcome::cancelled()),
            Err(e) => {
                return Watched::Quiet(self.watch_failed(job, format!("the watch command could not run: {e}")).await)
            }
        };
        let previous = job.state.watch.as_ref();
        let now = WatchSeen::of(&out.stdout);
        let empty = out.stdout.trim().is_empty();
        let fire = match watch.mode {
            WatchMode::ExitNonzero => !out.ok,
            _ if !out.ok => {
                let why = format!("the watch command failed:\n{}", out.rendered);
                return Watched::Quiet(self.watch_failed(job, why).await);
            }
            WatchMode::Nonempty => !empty,
            WatchMode::Changed => !empty && previous.is_none_or(|p| p.hash != now.hash),
        };
        // `exit-nonzero` watches the whole output (stderr too).
        let output = if watch.mode == WatchMode::ExitNonzero { out.rendered } else { out.stdout };
        if !fire {
            let why = match watch.mode {
                WatchMode::Changed if empty => "no output",
                WatchMode::Changed => "no change",
                WatchMode::Nonempty => "no output",
                WatchMode::ExitNonzero => "the command succeeded",
            };
            let outcome = RunOutcome::ok(format!("{why} (no model call)"));
            return Watched::Quiet(outcome.watched(Some(now)));
        }
        Watched::Fire { text: Fired { output, previous: previous.map(|p| p.output.clone()) }, seen: Some(now) }
    }

    /// A watcher whose command failed: an error in the history; reported only
    /// when the run before it did not fail too.
    async fn watch_failed(&self, job: &Job, why: String) -> RunOutcome {
        if job.state.last_status != Some(RunStatus::Error) {
            let report = format!("Watcher `{}` failed (reported once until it works again): {why}", job.name);
            self.reports.send(&job.report_targets(), &report, crate::bus::ReportSource::Job(job.name.clone())).await;
        }
        RunOutcome::error(why)
    }
}

/// What a watcher's command decided.
enum Watched {
    /// Nothing for the model: this is the run's outcome.
    Quiet(RunOutcome),
    /// Run the turn with this output; remember `seen`.
    Fire { text: Fired, seen: Option<WatchSeen> },
}

struct Fired {
    output: String,
    previous: Option<String>,
}

/// The job's message with `{output}` and `{previous}` filled in; without
/// `{output}` in it, the output is appended.
pub fn fill(message: &str, output: &str, previous: Option<&str>) -> String {
    let previous = previous.unwrap_or("(nothing: this is the first reading)");
    let mut text = String::with_capacity(message.len() + output.len());
    let mut rest = message;
    let mut placed = false;
    // One pass: what is filled in is never looked at again.
    while let Some(at) = rest.find('{') {
        text.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("{output}") {
            text.push_str(output);
            placed = true;
            rest = after;
        } else if let Some(after) = rest.strip_prefix("{previous}") {
            text.push_str(previous);
            rest = after;
        } else {
            text.push('{');
            rest = &rest[1..];
        }
    }
    text.push_str(rest);
    if !placed {
        text.push_str(&format!("\n\nThe watched command printed:\n```\n{output}\n```"));
    }
    text
}

impl JobExecutor for JobRunner {
    fn execute<'a>(&'a self, job: &'a Job, _scheduled: Timestamp) -> crate::util::BoxFuture<'a, RunOutcome> {
        Box::pin(self.run_job(job))
    }

    /// Missed runs and interrupted runs: one alert for the pass. A one-shot
    /// given up: its job's condition (cleared when it runs well again).
    fn incidents(&self, incidents: Vec<Incident>) {
        let alerts = self.alerts.clone();
        tokio::spawn(async move {
            if let Some(text) = crate::work::alerts::incidents_text(&incidents) {
                alerts.event(text).await;
            }
            for i in incidents {
                if let Incident::GaveUp { id, name } = i {
                    let text = format!(
                        "Alert: the one-shot job `{name}` was cut off twice while running (crash, kill or \
                         watchdog) and is given up: it is disabled. `bramble cron enable {name}` tries it again."
                    );
                    alerts.raise(&job_key(&id), text).await;
                }
            }
        });
    }

    /// Conditions of jobs that were removed are closed (without a note).
    fn jobs_loaded(&self, jobs: &[Job]) {
        // The common case, no job alert open, costs one `stat` (not a set of every id).
        if !self.alerts.maybe_open(|k| k.starts_with("job:")) {
            return;
        }
        let ids: std::collections::HashSet<String> = jobs.iter().map(|j| j.id.clone()).collect();
        let alerts = self.alerts.clone();
        tokio::spawn(async move {
            alerts.forget_jobs(ids).await;
        });
    }
}

/// Told about every job run as it ends, with its record
/// `{"job","status","started","finished","output"}` (MQTT publishes it).
pub type RunObserver = Arc<dyn Fn(&Job, &serde_json::Value) + Send + Sync>;

/// Decides whether this board runs an occurrence of a job placed on `any`
/// board (the fleet's "once across the fleet", `fleet::once`).
pub trait OnceGate: Send + Sync {
    /// `Ok(fence)`: this board won the slot, `fence` is its token (the KV
    /// revision); `Err(outcome)`: not run here, and why.
    fn claim<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> crate::util::BoxFuture<'a, Result<u64, RunOutcome>>;
}

/// A [`JobRunner`] whose runs are also reported to observers.
pub struct ObservedRunner {
    pub runner: JobRunner,
    pub observers: Vec<RunObserver>,
    /// For jobs placed on `any` board (`None`: such a job is not run here).
    pub gate: Option<Arc<dyn OnceGate>>,
}

impl ObservedRunner {
    /// A job placed on `any` board: the gate's fence, or the outcome of not running it.
    async fn claim(&self, job: &Job, scheduled: Timestamp) -> Result<Option<u64>, RunOutcome> {
        if job.placement != crate::scheduler::Placement::Any {
            return Ok(None);
        }
        match &self.gate {
            Some(gate) => gate.claim(job, scheduled).await.map(Some),
            None => Err(RunOutcome::skipped(
                "not run: the job is for any board and this board has no [fleet] nats_url to claim its slot",
            )),
        }
    }
}

impl JobExecutor for ObservedRunner {
    fn execute<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> crate::util::BoxFuture<'a, RunOutcome> {
        Box::pin(async move {
            let fence = match self.claim(job, scheduled).await {
                Ok(fence) => fence,
                Err(outcome) => return outcome,
            };
            let started = Timestamp::now();
            let mut outcome = self.runner.run_job(job).await;
            if let Some(f) = fence {
                outcome.summary = format!("[slot won, fence {f}] {}", outcome.summary);
            }
            if !self.observers.is_empty() {
                let mut record = serde_json::json!({
                    "job": job.name,
                    "status": outcome.status.to_string(),
                    "started": started.to_string(),
                    "finished": Timestamp::now().to_string(),
                    "output": crate::scheduler::job::truncate(&outcome.summary, 4000),
                    "model": outcome.model,
                });
                if let Some(f) = fence {
                    record["fence"] = f.into();
                }
                for observe in &self.observers {
                    observe(job, &record);
                }
            }
            outcome
        })
    }

    fn incidents(&self, incidents: Vec<Incident>) {
        self.runner.incidents(incidents);
    }

    fn jobs_loaded(&self, jobs: &[Job]) {
        self.runner.jobs_loaded(jobs);
    }
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn the_message_gets_the_output_and_the_previous_reading() {
        assert_eq!(fill("now {output}, was {previous}", "21.5", Some("20.0")), "now 21.5, was 20.0");
        assert_eq!(
            fill("was {previous}", "x", None),
            "was (nothing: this is the first reading)\n\nThe watched command printed:\n```\nx\n```"
        );
        // Filled-in text is not filled again; other braces stay.
        assert_eq!(fill("{output} {x}", "{previous}", Some("p")), "{previous} {x}");
    }
}
