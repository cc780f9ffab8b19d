//! The scheduler loop: sleep on the monotonic timer, wake, look at the wall
//! clock, run what is due.
//!
//! One task owns the job list and is the only writer of run state on the
//! daemon side; runs are spawned tasks that report back to it, so a long job
//! never blocks the others and all store writes happen in one place.
//!
//! - **Sleeping.** A kernel timer (monotonic) until the earliest `next_run`,
//!   capped at [`MAX_SLEEP`] (5 min). Nothing polls: an idle scheduler wakes
//!   about every five minutes. A step of the wall clock wakes it at once
//!   ([`crate::util::timer::clock_set`]); the cap bounds how long an
//!   unsignalled CLI edit, or a clock step the kernel could not report, goes
//!   unnoticed.
//! - **Clock jumps.** On each wake the wall-clock time elapsed is compared with
//!   the monotonic time elapsed; a difference over [`JUMP_THRESHOLD`] is logged
//!   as a jump. A backward jump re-anchors `every` jobs by its size (they keep
//!   their interval in real time); otherwise every wake re-plans every job with
//!   [`plan`], which applies the catch-up policy to what a forward jump skipped
//!   and never re-runs what a backward jump repeats.
//! - **Edits.** The store's stamp is checked on each wake (one `stat`), and
//!   the reload [`Notify`] (SIGHUP, IPC) makes the loop re-read at once.
//! - **Writes.** Per wake-up at most one store write, batching everything it
//!   decided: the write-ahead of the runs it starts (all scheduled runs, so a
//!   crash cannot repeat an occurrence), new plans, missed spans, re-anchors
//!   after a backward jump. Then one write per finished run. Nothing per tick.
//! - **Shutdown.** `cancel` stops the loop at once. Runs in flight are
//!   drained for a bounded time; a run still going after that is left
//!   unrecorded — at the next start a one-shot among them runs again, a
//!   recurring one is recorded as interrupted (see [`super::engine`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::engine::{self, plan, Clock, Decision, Missed, SystemClock, TRUST_FLOOR};
use super::job::{Job, RunStatus};
use super::schedule::{dur_since, Schedule};
use super::store::{find, JobStore, Stamp, StoreError};
use crate::util::pulse::Pulse;

pub use crate::util::BoxFuture;

/// The longest the loop sleeps without looking at the clock and the store.
/// Clock steps wake it at once ([`crate::util::timer::clock_set`]) and
/// `jobs.json` edits through the daemon's inotify watch, so this is a
/// backstop; it stays under half the dead-man's limit
/// ([`crate::work::alerts::SCHEDULER_STALL`]), whose alarm is the loop's beat.
pub const MAX_SLEEP: Duration = Duration::from_secs(5 * 60);
/// Wall time and monotonic time drifting apart by more than this is a clock jump.
pub const JUMP_THRESHOLD: Duration = Duration::from_secs(5);
/// While wall-clock jobs are held for clock sync, the probe is asked this often.
pub const HOLD_RECHECK: Duration = Duration::from_secs(15);
/// After a failed store write, try again this soon.
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(10);
/// By default, wall-clock jobs are held for sync at most this long after start;
/// then the clock is trusted anyway (if past the floor), with a warning. A board
/// with an RTC and no network never gets "synchronised".
pub const DEFAULT_SYNC_WAIT: Duration = Duration::from_secs(10 * 60);

/// How a run ended, as reported by the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// `Ok`, `Error` or `Skipped` (`Missed` is the scheduler's own).
    pub status: RunStatus,
    /// One line for the history (cut to 200 characters).
    pub summary: String,
    pub error: Option<String>,
    /// Which model answered (`provider/model`), for the history.
    pub model: Option<String>,
    /// What a watcher's command printed, kept in the job for the next run.
    pub watch: Option<super::WatchSeen>,
    /// The job may not run any more (its creator's rights ended): the
    /// scheduler disables it with this run.
    pub disable: bool,
}

impl RunOutcome {
    fn new(status: RunStatus, summary: String, error: Option<String>) -> RunOutcome {
        RunOutcome { status, summary, error, model: None, watch: None, disable: false }
    }
    pub fn ok(summary: impl Into<String>) -> RunOutcome {
        RunOutcome::new(RunStatus::Ok, summary.into(), None)
    }
    pub fn error(error: impl Into<String>) -> RunOutcome {
        let error = error.into();
        RunOutcome::new(RunStatus::Error, error.clone(), Some(error))
    }
    pub fn skipped(reason: impl Into<String>) -> RunOutcome {
        RunOutcome::new(RunStatus::Skipped, reason.into(), None)
    }

    /// Not run, and never to run again as it is: the job is disabled.
    pub fn refused(error: impl Into<String>) -> RunOutcome {
        RunOutcome { disable: true, ..RunOutcome::error(error) }
    }

    /// Interrupted by shutdown before it could finish.
    pub fn cancelled() -> RunOutcome {
        RunOutcome::new(RunStatus::Cancelled, "interrupted by shutdown".into(), None)
    }

    /// The same, saying which model answered.
    pub fn answered_by(mut self, model: Option<String>) -> RunOutcome {
        self.model = model;
        self
    }

    /// The same, with what a watcher saw.
    pub fn watched(mut self, seen: Option<super::WatchSeen>) -> RunOutcome {
        self.watch = seen;
        self
    }
}

/// How long a stopping scheduler waits for runs in flight to end (the daemon
/// cancels them after its own, shorter grace period).
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(20);

/// Runs a due job: the daemon's bridge to the agent, the sandbox and delivery.
///
/// `scheduled` is the occurrence being run (for a catch-up, the newest missed
/// one; for `bramble cron run`, the time of the request). The future should
/// honour the daemon's own cancellation; the scheduler never aborts it.
pub trait JobExecutor: Send + Sync + 'static {
    fn execute<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> BoxFuture<'a, RunOutcome>;

    /// What one pass decided that the owner should hear of, told after the
    /// pass's store write (so a restart does not decide and tell it again).
    /// Must not block: the scheduler's loop calls it. Default: nothing.
    fn incidents(&self, _incidents: Vec<Incident>) {}

    /// The jobs as just read from the store (at start and after every edit),
    /// for state kept about jobs elsewhere (alerts of removed jobs). Must not
    /// block. Default: nothing.
    fn jobs_loaded(&self, _jobs: &[Job]) {}
}

/// Something the scheduler decided about a job without running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incident {
    /// Occurrences passed without a run (daemon down, clock jump, held) and
    /// the job's catch-up policy did not make them up.
    Missed { id: String, name: String, missed: Missed },
    /// A recurring run was cut off by a crash, kill or watchdog restart; it is
    /// not run again.
    Interrupted { id: String, name: String, scheduled: Timestamp },
    /// A one-shot was cut off twice: given up and disabled.
    GaveUp { id: String, name: String },
}

impl Incident {
    /// The job's id.
    pub fn id(&self) -> &str {
        match self {
            Incident::Missed { id, .. } | Incident::Interrupted { id, .. } | Incident::GaveUp { id, .. } => id,
        }
    }
}

/// Talks to a running [`Scheduler`] (from a SIGHUP handler, IPC, the agent's tool).
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    reload: Arc<Notify>,
    run_now: mpsc::Sender<String>,
}

impl SchedulerHandle {
    /// Re-read `jobs.json` now (after an edit through another store handle).
    pub fn reload(&self) {
        self.reload.notify_one();
    }

    /// Run the job with this id or name now, outside its schedule
    /// (`bramble cron run`). Does not move its schedule; a one-shot run this
    /// way is done afterwards. Returns `false` if the scheduler is not running
    /// or has too many requests queued. An unknown job is logged and ignored:
    /// check with [`JobStore::get`] first for a good error message.
    pub fn run_now(&self, key: &str) -> bool {
        self.run_now.try_send(key.to_string()).is_ok()
    }
}

/// The daemon's scheduler as a service: [`Scheduler::run`] handing due jobs
/// to `executor`, until the stop (runs in flight end on their own cancel).
pub struct SchedulerLoop<E> {
    pub scheduler: Scheduler,
    pub executor: E,
}

impl<E: JobExecutor> SchedulerLoop<E> {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        self.scheduler.run(self.executor, shutdown.stop_token().clone()).await
    }
}

/// The scheduler. Build it, take handles, then [`run`](Scheduler::run) it.
pub struct Scheduler {
    store: JobStore,
    default_tz: TimeZone,
    clock: Arc<dyn Clock>,
    reload: Arc<Notify>,
    run_now_tx: mpsc::Sender<String>,
    run_now_rx: mpsc::Receiver<String>,
    sync_wait: Option<Duration>,
    wakeups: Arc<AtomicU64>,
    /// Jobs read before the loop started ([`preload`](Self::preload)).
    preloaded: Option<(Vec<Job>, Option<Stamp>)>,
    /// Beaten at the end of every pass: the dead-man's view of the loop.
    pulse: Pulse,
}

impl Scheduler {
    /// A scheduler over `store`, with cron jobs without a zone evaluated in
    /// `default_tz`, the system clock and [`DEFAULT_SYNC_WAIT`].
    pub fn new(store: JobStore, default_tz: TimeZone) -> Scheduler {
        let (run_now_tx, run_now_rx) = mpsc::channel(16);
        Scheduler {
            store,
            default_tz,
            clock: Arc::new(SystemClock),
            reload: Arc::new(Notify::new()),
            run_now_tx,
            run_now_rx,
            sync_wait: Some(DEFAULT_SYNC_WAIT),
            wakeups: Arc::new(AtomicU64::new(0)),
            preloaded: None,
            pulse: Pulse::new(),
        }
    }

    /// Read the jobs now (the daemon does, before READY, to log how many):
    /// the loop starts from them instead of reading `jobs.json` again — with
    /// thousands of jobs, a read is most of the start-up. Returns how many.
    pub fn preload(&mut self) -> Result<usize, StoreError> {
        let (jobs, stamp) = self.store.load_with_stamp()?;
        let n = jobs.len();
        self.preloaded = Some((jobs, stamp));
        Ok(n)
    }

    /// Use another wall clock (tests; a daemon option to skip the sync probe).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Scheduler {
        self.clock = clock;
        self
    }

    /// How long after start to hold wall-clock jobs for a clock that never
    /// reports sync; `None` holds them until it does.
    pub fn with_sync_wait(mut self, wait: Option<Duration>) -> Scheduler {
        self.sync_wait = wait;
        self
    }

    /// The `Notify` that makes the loop re-read the store (call `notify_one`).
    pub fn reload_handle(&self) -> Arc<Notify> {
        self.reload.clone()
    }

    /// A handle for reloads and manual runs.
    pub fn handle(&self) -> SchedulerHandle {
        SchedulerHandle { reload: self.reload.clone(), run_now: self.run_now_tx.clone() }
    }

    /// Beaten after every planning pass (at least once a minute while the
    /// loop is alive): for the daemon's dead-man.
    pub fn pulse(&self) -> Pulse {
        self.pulse.clone()
    }

    /// A counter of loop wake-ups since start (for `status` and for tests of idleness).
    pub fn wakeups(&self) -> Arc<AtomicU64> {
        self.wakeups.clone()
    }

    /// Run until `cancel`. Due jobs are handed to `executor`, each in its own
    /// task, at most one run per job at a time.
    pub async fn run(self, executor: impl JobExecutor, cancel: CancellationToken) {
        let Scheduler {
            store,
            default_tz,
            clock,
            reload,
            run_now_tx,
            mut run_now_rx,
            sync_wait,
            wakeups,
            preloaded,
            pulse,
        } = self;
        drop(run_now_tx);
        let mut lp = Loop::new(store, default_tz, clock, sync_wait, executor, preloaded);
        lp.exec.jobs_loaded(&lp.jobs);
        if let Some(notice) = lp.store.corrupt_notice() {
            error!("{notice}");
        }
        info!(jobs = lp.jobs.len(), "scheduler started");
        let mut force_reload = false;
        loop {
            wakeups.fetch_add(1, Ordering::Relaxed);
            lp.check_jump();
            let reloaded = force_reload || lp.store.changed_since(lp.stamp);
            if reloaded {
                lp.reload();
            }
            force_reload = false;
            let mut pass = lp.pass();
            let acted = pass.acted;
            if acted {
                // Plan again against the state just written (new next_run values).
                pass = lp.pass();
            }
            if reloaded || acted {
                // A read or rewrite of a large jobs.json freed megabytes: not kept while asleep.
                crate::util::sys::release_freed_memory();
            }
            pulse.beat();
            debug!(sleep_ms = pass.wake.as_millis() as u64, "scheduler sleeping");
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                Some(done) = lp.tasks.join_next_with_id(), if !lp.tasks.is_empty() => {
                    lp.joined(done, |e| RunOutcome::error(format!("the run panicked or was aborted: {e}")));
                }
                _ = reload.notified() => force_reload = true,
                Some(key) = run_now_rx.recv() => lp.manual.push(key),
                // On the dead-man's grid: when idle, both wake at the same instant.
                _ = crate::util::timer::sleep_on_grid(pass.wake, MAX_SLEEP) => {}
                _ = crate::util::timer::clock_set() => debug!("the wall clock was set"),
            }
        }
        lp.drain().await;
    }
}

/// A run in progress.
struct Run {
    scheduled: Timestamp,
    started: Timestamp,
    missed: Option<Missed>,
    manual: bool,
}

/// A run decided by a pass, started after the pass's store write.
struct Start {
    id: String,
    scheduled: Timestamp,
    missed: Option<Missed>,
    manual: bool,
}

/// One state change, applied to the list re-read under the store lock (or,
/// if the write fails, to the in-memory list so the loop still makes progress).
enum Change {
    Plan { id: String, next: Timestamp },
    Skip { id: String, missed: Missed, next: Option<Timestamp> },
    GiveUp { id: String },
    Expire { id: String },
    Interrupted { id: String, scheduled: Timestamp },
    Reanchor { id: String, by: SignedDuration },
    Start { id: String, scheduled: Timestamp, manual: bool },
    Finish { id: String, flight: Run, outcome: RunOutcome },
}

impl Change {
    fn apply(&self, jobs: &mut [Job], now: Timestamp, tz: &TimeZone) {
        let id = match self {
            Change::Plan { id, .. }
            | Change::Skip { id, .. }
            | Change::GiveUp { id }
            | Change::Expire { id }
            | Change::Interrupted { id, .. }
            | Change::Reanchor { id, .. }
            | Change::Start { id, .. }
            | Change::Finish { id, .. } => id,
        };
        // By id only: a name may have been reused by a different job meanwhile.
        let Some(job) = jobs.iter_mut().find(|j| &j.id == id) else { return };
        match self {
            Change::Plan { next, .. } => job.state.next_run = Some(*next),
            Change::Skip { missed, next, .. } => engine::mark_skipped(job, missed, *next, now),
            Change::GiveUp { .. } => engine::mark_given_up(job, now),
            Change::Expire { .. } => engine::mark_expired(job),
            Change::Interrupted { scheduled, .. } => engine::mark_interrupted(job, *scheduled, now, tz),
            Change::Reanchor { by, .. } => engine::reanchor(job, *by),
            Change::Start { scheduled, manual, .. } => {
                if job.enabled || *manual {
                    engine::mark_started(job, *scheduled, now, tz);
                }
                if !*manual {
                    job.state.runs = job.state.runs.saturating_add(1);
                }
            }
            Change::Finish { flight, outcome, .. } => {
                engine::mark_finished(
                    job,
                    flight.scheduled,
                    flight.started,
                    now,
                    outcome.status,
                    &outcome.summary,
                    outcome.error.as_deref(),
                    flight.missed.as_ref(),
                    flight.manual,
                    tz,
                );
                job.state.note_run(outcome.model.as_deref(), outcome.watch.as_ref());
                if outcome.disable {
                    job.enabled = false;
                }
            }
        }
    }
}

/// What a planning pass found.
struct Pass {
    /// How long to sleep.
    wake: Duration,
    /// Whether it changed anything (then the loop plans once more).
    acted: bool,
}

/// What a pass decided before writing anything: the changes, the runs to
/// start, the incidents to tell, how long to sleep, how many jobs are held.
struct Plans {
    changes: Vec<Change>,
    starts: Vec<Start>,
    incidents: Vec<Incident>,
    wake: Duration,
    held: usize,
}

impl Default for Plans {
    fn default() -> Plans {
        Plans { changes: Vec::new(), starts: Vec::new(), incidents: Vec::new(), wake: MAX_SLEEP, held: 0 }
    }
}

impl Plans {
    /// Take in what [`plan`] decided for one job (not running) at `now`.
    fn decided(&mut self, job: &Job, decision: Decision, now: Timestamp) {
        let name = &job.name;
        match decision {
            Decision::Idle => {}
            Decision::Hold => self.held += 1,
            Decision::Wait(next) => {
                if job.state.next_run != Some(next) {
                    self.changes.push(Change::Plan { id: job.id.clone(), next });
                }
                let start = next.checked_add(job.jitter_offset()).unwrap_or(next);
                self.wake = self.wake.min(dur_since(start, now));
            }
            Decision::Expire => {
                info!(job = %name, runs = job.state.runs, "job finished: its run limit or end time is reached");
                self.changes.push(Change::Expire { id: job.id.clone() });
            }
            Decision::Run { scheduled, missed, retry } => {
                if retry {
                    warn!(job = %name, "one-shot was interrupted during its run; running it again (once)");
                } else if let Some(m) = &missed {
                    warn!(job = %name, "{m}; running once now");
                }
                self.starts.push(Start { id: job.id.clone(), scheduled, missed, manual: false });
            }
            Decision::Skip { missed, next } => {
                warn!(job = %name, policy = %job.catch_up, "{missed}; skipped");
                if let Some(n) = next {
                    self.wake = self.wake.min(dur_since(n, now));
                }
                self.incidents.push(Incident::Missed { id: job.id.clone(), name: name.clone(), missed });
                self.changes.push(Change::Skip { id: job.id.clone(), missed, next });
            }
            Decision::Interrupted { scheduled } => {
                error!(
                    job = %name,
                    scheduled = %scheduled,
                    "run was interrupted (the daemon died during it: crash, kill or watchdog); not run again"
                );
                self.changes.push(Change::Interrupted { id: job.id.clone(), scheduled });
                self.incidents.push(Incident::Interrupted { id: job.id.clone(), name: name.clone(), scheduled });
            }
            Decision::GiveUp => {
                error!(job = %name, "one-shot was interrupted during its run twice; giving up");
                self.changes.push(Change::GiveUp { id: job.id.clone() });
                self.incidents.push(Incident::GaveUp { id: job.id.clone(), name: name.clone() });
            }
        }
    }
}

struct Loop<E> {
    store: JobStore,
    default_tz: TimeZone,
    clock: Arc<dyn Clock>,
    sync_wait: Option<Duration>,
    exec: Arc<E>,
    jobs: Vec<Job>,
    stamp: Option<Stamp>,
    inflight: HashMap<String, Run>,
    tasks: JoinSet<RunOutcome>,
    task_jobs: HashMap<tokio::task::Id, String>,
    manual: Vec<String>,
    started: Instant,
    wall_ref: Timestamp,
    mono_ref: Instant,
    holding: bool,
    trusting_unsynced: bool,
    /// The latest wall time the jobs recorded when the loop started (a clock
    /// earlier than this went back): [`engine::latest_record`].
    latest_record: Option<Timestamp>,
    /// A backward clock jump measured at the last wake, not yet applied.
    went_back: Option<SignedDuration>,
}

impl<E: JobExecutor> Loop<E> {
    /// The loop's state at start: the jobs read now, or as preloaded by the daemon.
    fn new(
        store: JobStore,
        default_tz: TimeZone,
        clock: Arc<dyn Clock>,
        sync_wait: Option<Duration>,
        executor: E,
        preloaded: Option<(Vec<Job>, Option<Stamp>)>,
    ) -> Loop<E> {
        let now = clock.now();
        let mut lp = Loop {
            store,
            default_tz,
            clock,
            sync_wait,
            exec: Arc::new(executor),
            jobs: Vec::new(),
            stamp: None,
            inflight: HashMap::new(),
            tasks: JoinSet::new(),
            task_jobs: HashMap::new(),
            manual: Vec::new(),
            started: Instant::now(),
            wall_ref: now,
            mono_ref: Instant::now(),
            holding: false,
            trusting_unsynced: false,
            latest_record: None,
            went_back: None,
        };
        match preloaded {
            // Changed since (a `cron add` in between) is caught by the first pass's stamp check.
            Some((jobs, stamp)) => (lp.jobs, lp.stamp) = (jobs, stamp),
            None => lp.reload(),
        }
        lp.latest_record = engine::latest_record(&lp.jobs);
        lp
    }

    /// Record a run task that ended; `failed` words the outcome of one that panicked or was aborted.
    fn joined(
        &mut self,
        done: Result<(tokio::task::Id, RunOutcome), tokio::task::JoinError>,
        failed: impl FnOnce(&tokio::task::JoinError) -> RunOutcome,
    ) {
        let (task, outcome) = match done {
            Ok((task, outcome)) => (task, outcome),
            Err(e) => (e.id(), failed(&e)),
        };
        if let Some(id) = self.task_jobs.remove(&task) {
            self.finished(&id, outcome);
        }
    }

    /// Record the runs still going as they end (the daemon bounds how long
    /// they may take and cancels them after its grace period), so a run that
    /// finished during shutdown is not run again after the restart.
    async fn drain(&mut self) {
        let left = self.inflight.len();
        let drain = async {
            while let Some(done) = self.tasks.join_next_with_id().await {
                self.joined(done, |_| RunOutcome::cancelled());
            }
        };
        // Bounded: an executor that ignores cancellation cannot hold shutdown forever.
        if tokio::time::timeout(SHUTDOWN_DRAIN, drain).await.is_err() {
            warn!(runs = self.inflight.len(), "runs still going at shutdown; leaving them unrecorded");
            self.tasks.detach_all();
        }
        info!(runs_in_flight_at_stop = left, "scheduler stopped");
    }

    /// Re-read the store. A corrupt file has been kept aside by the store:
    /// say so loudly and go on with what the store now holds (nothing).
    fn reload(&mut self) {
        match self.store.load_with_stamp() {
            Ok((jobs, stamp)) => {
                debug!(jobs = jobs.len(), "scheduler loaded jobs");
                self.jobs = jobs;
                self.stamp = stamp;
                self.exec.jobs_loaded(&self.jobs);
            }
            Err(e @ StoreError::Corrupt { .. }) => {
                error!("{e}");
                self.jobs.clear();
                self.stamp = self.store.stamp();
                // Not told: the jobs are not gone, their file is (kept aside); their alerts stay.
            }
            Err(e) => {
                // Unreadable or from a newer bramble: keep what we had, don't spin on it.
                error!("cannot read jobs: {e}; keeping the {} jobs already loaded", self.jobs.len());
                self.stamp = self.store.stamp();
            }
        }
    }

    /// Compare wall-clock and monotonic time elapsed since the last wake.
    fn check_jump(&mut self) {
        let wall = self.clock.now();
        let mono = Instant::now();
        let wall_elapsed = wall.duration_since(self.wall_ref);
        let mono_elapsed = SignedDuration::try_from(mono - self.mono_ref).unwrap_or(SignedDuration::MAX);
        let drift = wall_elapsed - mono_elapsed;
        if drift.unsigned_abs() > JUMP_THRESHOLD {
            let dir = if drift.is_positive() { "forward" } else { "backward" };
            let by =
                jiff::Span::try_from(drift.abs()).map(|s| format!("{s:#}")).unwrap_or_else(|_| format!("{drift:?}"));
            warn!("clock jumped {dir} by {by}; re-planning all jobs under their catch-up policy");
            if drift.is_negative() {
                self.went_back = Some(self.went_back.unwrap_or(SignedDuration::ZERO) + drift);
            }
        }
        self.wall_ref = wall;
        self.mono_ref = mono;
    }

    /// Whether wall-clock (cron/at) jobs may run now: see [`engine::clock_suspect`].
    /// A suspect clock is trusted anyway once the machine has been up for
    /// `sync_wait` (booting) or this loop has run that long (behind, unknown).
    fn trusted(&mut self, now: Timestamp) -> bool {
        let synced = now >= TRUST_FLOOR && self.clock.synchronized();
        if synced {
            self.trusting_unsynced = false;
            return true;
        }
        let Some(wait) = self.sync_wait else { return false };
        let uptime = self.clock.uptime();
        let suspect = engine::clock_suspect(now, false, uptime, self.latest_record, wait);
        let waited_enough = match suspect {
            None => true,
            Some(engine::Suspect::BeforeFloor) => return false,
            // Booting ends by itself (the uptime passes the wait: `None` above).
            Some(engine::Suspect::Booting { .. } | engine::Suspect::Behind { .. } | engine::Suspect::Unknown) => {
                self.started.elapsed() >= wait
            }
        };
        if waited_enough && !self.trusting_unsynced {
            match suspect {
                None => info!(
                    uptime_s = uptime.map_or(0, |u| u.as_secs()),
                    "the clock reports no NTP sync, but the machine is not freshly booted and the clock is past \
                     bramble's last record: trusted for cron and at jobs"
                ),
                Some(why) => {
                    warn!("the clock still reports no NTP sync ({why}); trusting it for cron and at jobs anyway")
                }
            }
            self.trusting_unsynced = true;
        }
        waited_enough
    }

    /// Plan every job, write what changed in one store update, start the runs.
    fn pass(&mut self) -> Pass {
        let now = self.clock.now();
        let trusted = self.trusted(now);
        let mut plans = Plans { changes: self.reanchor(now), ..Plans::default() };
        for job in &self.jobs {
            if !self.inflight.contains_key(&job.id) {
                plans.decided(job, plan(job, now, &self.default_tz, trusted), now);
            }
        }
        self.take_manual(&mut plans, now);
        self.note_held(&mut plans);
        self.write_and_start(plans, now)
    }

    /// `every` jobs keep their interval across a backward jump: move their
    /// grid by the measured jump (or onto now if the clock is behind their
    /// last run for another reason, e.g. it went back while we were down).
    fn reanchor(&mut self, now: Timestamp) -> Vec<Change> {
        let mut changes = Vec::new();
        let went_back = self.went_back.take();
        for job in &mut self.jobs {
            let by = match went_back {
                Some(by) if matches!(job.schedule, Schedule::Every { .. }) => Some(by),
                _ => None,
            };
            let by = by.or_else(|| if self.inflight.contains_key(&job.id) { None } else { engine::behind(job, now) });
            if let Some(by) = by {
                info!(job = %job.name, "clock went back; every job re-anchored to keep its interval");
                engine::reanchor(job, by);
                if let Some(run) = self.inflight.get_mut(&job.id) {
                    run.scheduled = run.scheduled.checked_add(by).unwrap_or(run.scheduled);
                }
                changes.push(Change::Reanchor { id: job.id.clone(), by });
            }
        }
        changes
    }

    /// The runs asked for by hand ("run now"), unless already running.
    fn take_manual(&mut self, plans: &mut Plans, now: Timestamp) {
        for key in std::mem::take(&mut self.manual) {
            let Some(i) = find(&self.jobs, &key) else {
                warn!(job = %key, "run now: no such job");
                continue;
            };
            let id = self.jobs[i].id.clone();
            if self.inflight.contains_key(&id) || plans.starts.iter().any(|s| s.id == id) {
                warn!(job = %key, "run now: it is already running");
                continue;
            }
            plans.starts.push(Start { id, scheduled: now, missed: None, manual: true });
        }
    }

    /// Say when holding for an unsynchronised clock begins and ends; recheck soon while holding.
    fn note_held(&mut self, plans: &mut Plans) {
        if plans.held > 0 {
            if !self.holding {
                info!(jobs = plans.held, "holding cron and at jobs until the clock is synchronised");
            }
            plans.wake = plans.wake.min(HOLD_RECHECK);
        } else if self.holding {
            info!("clock trusted; releasing held jobs");
        }
        self.holding = plans.held > 0;
    }

    /// Write the pass's changes (with the write-ahead of its starts) in one
    /// store update, tell the incidents, then start the runs written ahead.
    fn write_and_start(&mut self, plans: Plans, now: Timestamp) -> Pass {
        let Plans { mut changes, starts, incidents, mut wake, .. } = plans;
        // The write-ahead: every scheduled run, and one-shots run by hand.
        for s in &starts {
            if !s.manual || self.jobs.iter().any(|j| j.id == s.id && j.schedule.is_one_shot()) {
                changes.push(Change::Start { id: s.id.clone(), scheduled: s.scheduled, manual: s.manual });
            }
        }
        let acted = !changes.is_empty() || !starts.is_empty();
        let written = changes.is_empty() || self.commit(changes, now);
        if !written {
            wake = wake.min(RETRY_AFTER_ERROR);
        }
        if !incidents.is_empty() {
            self.exec.incidents(incidents);
        }
        for s in starts {
            let Some(job) = self.jobs.iter().find(|j| j.id == s.id) else { continue };
            if !s.manual && !job.enabled {
                continue; // disabled by an edit that landed just before our write
            }
            if (!s.manual || job.schedule.is_one_shot()) && job.state.running_since != Some(now) {
                continue; // no write-ahead, no run
            }
            self.spawn(job.clone(), s, now);
        }
        Pass { wake, acted }
    }

    /// Apply `changes` through the store (one locked read-modify-write) and
    /// adopt the result. On failure, apply them in memory (but never mark a
    /// run started that was not written ahead) and return `false`.
    fn commit(&mut self, changes: Vec<Change>, now: Timestamp) -> bool {
        let tz = self.default_tz.clone();
        let result = self.store.update_with_stamp(|jobs| {
            for c in &changes {
                c.apply(jobs, now, &tz);
            }
            Ok(jobs.clone())
        });
        match result {
            Ok((jobs, stamp)) => {
                self.jobs = jobs;
                self.stamp = stamp;
                true
            }
            Err(e) => {
                error!("cannot write job state: {e}; keeping it in memory");
                // A recurring start is marked in memory (this process will not
                // run it twice); a one-shot does not run without its write-ahead.
                for c in &changes {
                    if matches!(c, Change::Reanchor { .. }) {
                        continue; // applied to the list already, before planning
                    }
                    if let Change::Start { id, .. } = c {
                        if self.jobs.iter().any(|j| &j.id == id && j.schedule.is_one_shot()) {
                            continue;
                        }
                    }
                    c.apply(&mut self.jobs, now, &tz);
                }
                false
            }
        }
    }

    fn spawn(&mut self, job: Job, s: Start, now: Timestamp) {
        info!(job = %job.name, scheduled = %s.scheduled, manual = s.manual, "running job");
        let exec = self.exec.clone();
        let scheduled = s.scheduled;
        let handle = self.tasks.spawn(async move { exec.execute(&job, scheduled).await });
        self.task_jobs.insert(handle.id(), s.id.clone());
        self.inflight.insert(s.id, Run { scheduled, started: now, missed: s.missed, manual: s.manual });
    }

    fn finished(&mut self, id: &str, outcome: RunOutcome) {
        let Some(flight) = self.inflight.remove(id) else { return };
        let now = self.clock.now();
        let name = self.jobs.iter().find(|j| j.id == id).map_or(id, |j| j.name.as_str());
        match &outcome.error {
            Some(e) => warn!(job = %name, status = %outcome.status, "job finished: {e}"),
            None => info!(job = %name, status = %outcome.status, "job finished"),
        }
        self.commit(vec![Change::Finish { id: id.to_string(), flight, outcome }], now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;
    use crate::scheduler::job::{CatchUp, JobKind};
    use crate::scheduler::schedule::{parse_cron, Schedule};
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    /// Wall clock = base + tokio (paused) time elapsed + an adjustable offset.
    struct FakeClock {
        base: Timestamp,
        start: Instant,
        offset: Mutex<SignedDuration>,
        synced: AtomicBool,
        /// Uptime at `start`; `None`: unknown.
        booted: Mutex<Option<Duration>>,
    }

    impl FakeClock {
        fn new(base: &str) -> Arc<FakeClock> {
            Arc::new(FakeClock {
                base: base.parse().unwrap(),
                start: Instant::now(),
                offset: Mutex::new(SignedDuration::ZERO),
                synced: AtomicBool::new(true),
                booted: Mutex::new(None),
            })
        }
        fn jump(&self, by: SignedDuration) {
            *self.offset.lock().unwrap() += by;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Timestamp {
            let mono = SignedDuration::try_from(Instant::now() - self.start).unwrap();
            self.base + mono + *self.offset.lock().unwrap()
        }
        fn synchronized(&self) -> bool {
            self.synced.load(Ordering::SeqCst)
        }
        fn uptime(&self) -> Option<Duration> {
            self.booted.lock().unwrap().map(|b| b + (Instant::now() - self.start))
        }
    }

    /// Records (job name, scheduled, wall time at start); each run takes `takes`.
    struct Recorder {
        clock: Arc<FakeClock>,
        runs: Arc<Mutex<Vec<(String, Timestamp, Timestamp)>>>,
        takes: Duration,
        hang: Option<String>,
        incidents: Arc<Mutex<Vec<Vec<Incident>>>>,
    }

    impl JobExecutor for Recorder {
        fn incidents(&self, incidents: Vec<Incident>) {
            self.incidents.lock().unwrap().push(incidents);
        }

        fn execute<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> BoxFuture<'a, RunOutcome> {
            Box::pin(async move {
                self.runs.lock().unwrap().push((job.name.clone(), scheduled, self.clock.now()));
                if self.hang.as_deref() == Some(job.name.as_str()) {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(self.takes).await;
                RunOutcome::ok(format!("ran {}", job.name))
            })
        }
    }

    struct Harness {
        dir: tempfile::TempDir,
        clock: Arc<FakeClock>,
        runs: Arc<Mutex<Vec<(String, Timestamp, Timestamp)>>>,
        /// What each pass told the executor, pass by pass.
        incidents: Arc<Mutex<Vec<Vec<Incident>>>>,
    }

    impl Harness {
        fn new(base: &str) -> Harness {
            Harness {
                dir: tempfile::tempdir().unwrap(),
                clock: FakeClock::new(base),
                runs: Arc::default(),
                incidents: Arc::default(),
            }
        }
        fn incidents(&self) -> Vec<Vec<Incident>> {
            self.incidents.lock().unwrap().clone()
        }
        fn store(&self) -> JobStore {
            JobStore::open(self.dir.path())
        }
        fn now(&self) -> Timestamp {
            self.clock.now()
        }
        fn add(&self, name: &str, schedule: Schedule, f: impl FnOnce(&mut Job)) -> Job {
            let mut job =
                Job::new(name, schedule, JobKind::Remind { text: name.into() }, vec![], self.now(), &TimeZone::UTC)
                    .unwrap();
            f(&mut job);
            self.store().add(job).unwrap()
        }
        fn scheduler(&self) -> Scheduler {
            Scheduler::new(self.store(), TimeZone::UTC).with_clock(self.clock.clone())
        }
        fn start(&self, s: Scheduler, hang: Option<&str>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
            let cancel = CancellationToken::new();
            let exec = Recorder {
                clock: self.clock.clone(),
                runs: self.runs.clone(),
                takes: Duration::from_secs(1),
                hang: hang.map(str::to_string),
                incidents: self.incidents.clone(),
            };
            let task = tokio::spawn(s.run(exec, cancel.clone()));
            (cancel, task)
        }
        /// (name, scheduled) of every run so far.
        fn runs(&self) -> Vec<(String, Timestamp)> {
            self.runs.lock().unwrap().iter().map(|(n, s, _)| (n.clone(), *s)).collect()
        }
        fn job(&self, name: &str) -> Job {
            self.store().get(name).unwrap()
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    async fn advance(secs: u64) {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }

    async fn stop(c: (CancellationToken, tokio::task::JoinHandle<()>)) {
        c.0.cancel();
        c.1.await.unwrap();
    }

    fn every(secs: u64, anchor: Timestamp) -> Schedule {
        Schedule::Every { every: Dur::secs(secs), anchor }
    }

    #[tokio::test(start_paused = true)]
    async fn every_cron_and_at_fire_at_their_times() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("tick", every(600, h.now()), |_| {});
        h.add("cron", parse_cron("*/15 * * * *", None).unwrap(), |_| {});
        h.add("once", Schedule::at(ts("2026-05-01T08:20:00Z")), |_| {});
        let run = h.start(h.scheduler(), None);
        advance(31 * 60).await;
        stop(run).await;
        let mut got = h.runs.lock().unwrap().clone();
        got.sort_by_key(|r| (r.1, r.0.clone()));
        let want = [
            ("tick", "08:10"),
            ("cron", "08:15"),
            ("tick", "08:20"),
            ("once", "08:20"),
            ("cron", "08:30"),
            ("tick", "08:30"),
        ];
        let mut want: Vec<(String, Timestamp)> =
            want.iter().map(|(n, t)| (n.to_string(), ts(&format!("2026-05-01T{t}:00Z")))).collect();
        want.sort_by_key(|r| (r.1, r.0.clone()));
        assert_eq!(got.iter().map(|(n, s, _)| (n.clone(), *s)).collect::<Vec<_>>(), want);
        // Fired on time: the wall clock at the start of each run is its scheduled time.
        for (name, scheduled, started) in &got {
            assert_eq!(scheduled, started, "{name}");
        }
        let once = h.job("once");
        assert!(once.state.done && !once.enabled);
        let tick = h.job("tick");
        assert_eq!(tick.state.last_run, Some(ts("2026-05-01T08:30:00Z")));
        assert_eq!(tick.state.next_run, Some(ts("2026-05-01T08:40:00Z")));
        assert_eq!(tick.state.history.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_scheduler_wakes_about_every_five_minutes() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("daily", parse_cron("0 9 * * *", None).unwrap(), |_| {});
        let s = h.scheduler();
        let wakes = s.wakeups();
        let pulse = s.pulse();
        let run = h.start(s, None);
        advance(30 * 60).await;
        // Idle, yet alive to the dead-man: a pass at least every five
        // minutes, well inside its limit.
        assert!(pulse.silent_for() <= MAX_SLEEP, "{:?}", pulse.silent_for());
        assert!(MAX_SLEEP * 2 <= crate::work::alerts::SCHEDULER_STALL);
        stop(run).await;
        let n = wakes.load(Ordering::Relaxed);
        assert!((6..=8).contains(&n), "{n} wake-ups in 30 idle minutes");
        assert!(h.runs().is_empty());
        advance(10 * 60).await;
        assert!(pulse.silent_for() >= Duration::from_secs(10 * 60), "a stopped loop is silent");
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_run_does_not_block_other_jobs_nor_overlap_itself() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("slow", every(10, h.now()), |_| {});
        h.add("fast", every(10, h.now()), |_| {});
        let cancel = CancellationToken::new();
        struct Slow(Arc<FakeClock>, Arc<Mutex<Vec<(String, Timestamp, Timestamp)>>>);
        impl JobExecutor for Slow {
            fn execute<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> BoxFuture<'a, RunOutcome> {
                Box::pin(async move {
                    self.1.lock().unwrap().push((job.name.clone(), scheduled, self.0.now()));
                    let secs = if job.name == "slow" { 25 } else { 1 };
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                    RunOutcome::ok("")
                })
            }
        }
        let task = tokio::spawn(h.scheduler().run(Slow(h.clock.clone(), h.runs.clone()), cancel.clone()));
        advance(65).await;
        stop((cancel, task)).await;
        let runs = h.runs();
        let fast: Vec<_> = runs.iter().filter(|r| r.0 == "fast").map(|r| r.1).collect();
        let slow: Vec<_> = runs.iter().filter(|r| r.0 == "slow").map(|r| r.1).collect();
        let t = |s: &str| ts(&format!("2026-05-01T08:{s}Z"));
        assert_eq!(fast, [t("00:10"), t("00:20"), t("00:30"), t("00:40"), t("00:50"), t("01:00")]);
        // slow runs 08:00:10–35; 20 and 30 pass meanwhile; 30 is within the grace → runs
        // 35–60; then 60 is on time (40 and 50 reported missed). Never two at once.
        assert_eq!(slow, [t("00:10"), t("00:30"), t("01:00")]);
        let hist: Vec<_> = h.job("slow").state.history.iter().map(|r| (r.status, r.scheduled)).collect();
        // The 01:00 run was still going when the scheduler stopped: it is waited
        // for and recorded (with the occurrences it had skipped), not lost.
        assert_eq!(
            hist,
            [
                (RunStatus::Ok, t("00:10")),
                (RunStatus::Missed, t("00:20")),
                (RunStatus::Ok, t("00:30")),
                (RunStatus::Missed, t("00:50")),
                (RunStatus::Ok, t("01:00"))
            ]
        );
    }

    /// A store whose jobs were planned long ago: the daemon was down from 08:05 to 13:05.
    fn downtime(policy: CatchUp) -> (Harness, Scheduler) {
        let h = Harness::new("2026-05-01T13:05:00Z");
        let down_since = ts("2026-05-01T08:00:00Z");
        h.add("hourly", parse_cron("30 * * * *", None).unwrap(), |j| {
            j.catch_up = policy;
            j.created = down_since;
            j.state.next_run = Some(ts("2026-05-01T08:30:00Z"));
        });
        h.add("tick", every(600, down_since), |j| {
            j.catch_up = policy;
            j.state.next_run = Some(ts("2026-05-01T08:10:00Z"));
        });
        let s = h.scheduler();
        (h, s)
    }

    #[tokio::test(start_paused = true)]
    async fn downtime_with_skip_runs_nothing_old_and_resumes() {
        let (h, s) = downtime(CatchUp::Skip);
        let run = h.start(s, None);
        advance(30 * 60).await;
        stop(run).await;
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        let mut runs = h.runs();
        runs.sort_by_key(|r| r.1);
        // Only future occurrences: 13:10, 13:20, 13:30 (tick) and 13:30 (hourly).
        let names: Vec<_> = runs.iter().map(|r| (r.0.as_str(), r.1)).collect();
        assert!(names.contains(&("hourly", t("13:30"))));
        assert_eq!(
            names.iter().filter(|r| r.0 == "tick").map(|r| r.1).collect::<Vec<_>>(),
            [t("13:10"), t("13:20"), t("13:30")]
        );
        assert_eq!(runs.len(), 4);
        let missed = &h.job("hourly").state.history[0];
        assert_eq!(missed.status, RunStatus::Missed);
        assert!(missed.summary.contains("missed 5 occurrences"), "{}", missed.summary);
        // Both misses told in one batch (one alert for the downtime), once.
        let told = h.incidents();
        assert_eq!(told.len(), 1, "{told:?}");
        let mut names: Vec<_> = told[0]
            .iter()
            .map(|i| match i {
                Incident::Missed { name, missed, .. } => (name.as_str(), missed.count),
                other => panic!("{other:?}"),
            })
            .collect();
        names.sort();
        assert_eq!(names, [("hourly", 5), ("tick", 30)]);
    }

    #[tokio::test(start_paused = true)]
    async fn downtime_with_once_runs_one_catch_up() {
        let (h, s) = downtime(CatchUp::Once);
        let run = h.start(s, None);
        advance(5).await;
        stop(run).await;
        let mut runs = h.runs();
        runs.sort();
        // One catch-up each, for the newest missed occurrence.
        assert_eq!(
            runs,
            [("hourly".to_string(), ts("2026-05-01T12:30:00Z")), ("tick".to_string(), ts("2026-05-01T13:00:00Z"))]
        );
        assert_eq!(h.job("hourly").state.next_run, Some(ts("2026-05-01T13:30:00Z")));
        assert!(h.incidents().is_empty(), "made up by the policy: nothing to alert");
    }

    #[tokio::test(start_paused = true)]
    async fn downtime_with_a_window_catches_up_only_recent_misses() {
        // hourly's newest miss (12:30) is 35 min old, tick's (13:00) 5 min.
        let (h, s) = downtime(CatchUp::Window(Dur::secs(20 * 60)));
        let run = h.start(s, None);
        advance(5).await;
        stop(run).await;
        assert_eq!(h.runs(), [("tick".to_string(), ts("2026-05-01T13:00:00Z"))]);
        assert_eq!(h.job("hourly").state.last_status, Some(RunStatus::Missed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forward_jump_keeps_every_jobs_running() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("tick", every(60, h.now()), |_| {});
        h.add("hourly", parse_cron("0 * * * *", None).unwrap(), |j| j.catch_up = CatchUp::Once);
        let run = h.start(h.scheduler(), None);
        advance(150).await; // runs tick at 08:01, 08:02
        h.clock.jump(SignedDuration::from_hours(3)); // wall: 11:02:30
        advance(60).await; // monotonic +1 min
        advance(5 * 60).await;
        stop(run).await;
        let ticks: Vec<_> = h.runs().into_iter().filter(|r| r.0 == "tick").map(|r| r.1).collect();
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        assert_eq!(&ticks[..2], [t("08:01"), t("08:02")]);
        // After the jump: the old span skipped, then every minute again.
        assert_eq!(&ticks[2..], [t("11:03"), t("11:04"), t("11:05"), t("11:06"), t("11:07"), t("11:08")]);
        // The hourly job caught up once for 09:00–11:00 (policy once).
        let hourly: Vec<_> = h.runs().into_iter().filter(|r| r.0 == "hourly").map(|r| r.1).collect();
        assert_eq!(hourly, [t("11:00")]);
        assert!(h.job("tick").state.history.iter().any(|r| r.status == RunStatus::Missed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_backward_jump_never_fires_twice() {
        let h = Harness::new("2026-05-01T08:58:00Z");
        h.add("nine", parse_cron("0 9 * * *", None).unwrap(), |_| {});
        h.add("tick", every(600, ts("2026-05-01T08:00:00Z")), |_| {});
        let run = h.start(h.scheduler(), None);
        advance(5 * 60).await; // 09:03: nine ran at 09:00, tick at 09:00
        h.clock.jump(SignedDuration::from_hours(-1)); // wall: 08:03 again
        advance(70 * 60).await; // wall reaches 09:13
        stop(run).await;
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        let nine: Vec<_> = h.runs().into_iter().filter(|r| r.0 == "nine").map(|r| r.1).collect();
        assert_eq!(nine, [t("09:00")], "09:00 must not fire again after the clock went back");
        // tick keeps its 10 min interval in real time: re-anchored by the jump,
        // its next run after 09:00 (old clock) is 08:10 on the new clock.
        let ticks: Vec<_> = h.runs().into_iter().filter(|r| r.0 == "tick").map(|r| r.1).collect();
        let mut want = vec![t("09:00")];
        want.extend(["08:10", "08:20", "08:30", "08:40", "08:50", "09:00", "09:10"].map(t));
        assert_eq!(ticks, want);
    }

    /// An every job runs at `t0`; the clock goes back by `jump` 30 s later; the
    /// next run comes one interval after `t0` in monotonic time.
    async fn every_across_a_backward_jump(jump: SignedDuration) {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("tick", every(600, h.now()), |_| {});
        let run = h.start(h.scheduler(), None);
        advance(10 * 60 + 30).await; // ran at 08:10:00
        h.clock.jump(jump);
        advance(10 * 60).await; // monotonic 08:20:30
        stop(run).await;
        let starts: Vec<_> = h.runs.lock().unwrap().iter().map(|r| r.2).collect();
        let first = ts("2026-05-01T08:10:00Z");
        // The second run started 600 s after the first in real time (wall + jump).
        assert_eq!(starts, [first, first + SignedDuration::from_secs(600) + jump], "jump {jump:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_every_job_keeps_its_interval_across_a_65s_backward_jump() {
        every_across_a_backward_jump(SignedDuration::from_secs(-65)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_every_job_keeps_its_interval_across_a_1h_backward_jump() {
        every_across_a_backward_jump(SignedDuration::from_hours(-1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_every_job_behind_its_last_run_at_start_runs_one_interval_from_now() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        // Last ran at 09:00 by a clock that was an hour ahead (set back while down).
        h.add("tick", every(600, ts("2026-05-01T07:00:00Z")), |j| {
            j.state.last_run = Some(ts("2026-05-01T09:00:00Z"));
            j.state.next_run = Some(ts("2026-05-01T09:10:00Z"));
        });
        let run = h.start(h.scheduler(), None);
        advance(11 * 60).await;
        stop(run).await;
        assert_eq!(h.runs(), [("tick".to_string(), ts("2026-05-01T08:10:00Z"))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recurring_run_interrupted_by_a_crash_is_not_run_again() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("e3", every(60, h.now()), |_| {});
        // The process "dies" during the 08:01 run (the executor hangs, the loop is dropped).
        let run = h.start(h.scheduler(), Some("e3"));
        advance(65).await;
        stop(run).await; // bounded drain: 08:01:25, the run is left unrecorded
        assert!(h.job("e3").state.running_since.is_some(), "the start was written ahead");
        // Restart within the grace of 08:01: that occurrence is not run again.
        let run = h.start(h.scheduler(), None);
        advance(60).await;
        stop(run).await;
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        assert_eq!(h.runs(), [("e3".to_string(), t("08:01")), ("e3".to_string(), t("08:02"))]);
        let job = h.job("e3");
        let hist: Vec<_> = job.state.history.iter().map(|r| (r.status, r.scheduled)).collect();
        assert_eq!(hist, [(RunStatus::Error, t("08:01")), (RunStatus::Ok, t("08:02"))]);
        assert!(job.state.history[0].summary.starts_with("interrupted"));
        assert_eq!(job.state.running_since, None);
        assert_eq!(
            h.incidents(),
            [vec![Incident::Interrupted { id: job.id.clone(), name: "e3".into(), scheduled: t("08:01") }]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_shot_runs_exactly_once_across_a_restart() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("remind", Schedule::at(ts("2026-05-01T08:01:00Z")), |_| {});
        let run = h.start(h.scheduler(), None);
        advance(90).await; // ran at 08:01, finished at 08:01:01, state written
        stop(run).await; // "crash" right after the write
        assert!(h.job("remind").state.done);
        let run = h.start(h.scheduler(), None);
        advance(10 * 60).await;
        stop(run).await;
        assert_eq!(h.runs(), [("remind".to_string(), ts("2026-05-01T08:01:00Z"))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_shot_interrupted_mid_run_runs_again_once_then_gives_up() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("remind", Schedule::at(ts("2026-05-01T08:01:00Z")), |_| {});
        for _ in 0..3 {
            // Each process "dies" during the run (the executor hangs; then the loop is dropped).
            let run = h.start(h.scheduler(), Some("remind"));
            advance(120).await;
            stop(run).await;
        }
        assert_eq!(h.runs().len(), 2, "the first run and one retry");
        let job = h.job("remind");
        assert!(job.state.done && !job.enabled);
        assert_eq!(job.state.attempts, 2);
        assert_eq!(job.state.last_status, Some(RunStatus::Error));
        // Told once (the third start), for the alert.
        assert_eq!(h.incidents(), [vec![Incident::GaveUp { id: job.id.clone(), name: "remind".into() }]]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsynchronized_clock_holds_cron_and_at_until_synced() {
        let h = Harness::new("2026-05-01T08:59:00Z");
        h.clock.synced.store(false, Ordering::SeqCst);
        h.add("nine", parse_cron("0 9 * * *", None).unwrap(), |_| {});
        h.add("once", Schedule::at(ts("2026-05-01T09:00:00Z")), |_| {});
        h.add("tick", every(60, ts("2026-05-01T08:00:00Z")), |_| {});
        let run = h.start(h.scheduler().with_sync_wait(None), None);
        advance(150).await; // wall 09:01:30: tick ran, the others held
        let names: Vec<_> = h.runs().into_iter().map(|r| r.0).collect();
        assert_eq!(names, ["tick", "tick"]);
        h.clock.synced.store(true, Ordering::SeqCst); // NTP synced at 09:01:30
        advance(20).await;
        stop(run).await;
        let mut late: Vec<_> = h.runs().into_iter().filter(|r| r.0 != "tick").collect();
        late.sort();
        let nine = ts("2026-05-01T09:00:00Z");
        // Released: 09:00 is 1.5 min old, past the grace, so the policy decides:
        // `at` defaults to once (runs), cron to skip (recorded as missed).
        assert_eq!(late, [("once".to_string(), nine)]);
        assert_eq!(h.job("nine").state.last_status, Some(RunStatus::Missed));
        assert_eq!(h.job("nine").state.next_run, Some(ts("2026-05-02T09:00:00Z")));
    }

    /// A container, a VM, a board with an RTC: the kernel never reports sync,
    /// but the machine has been up for hours and the clock is past every
    /// record. Nothing is held (it was held 10 minutes after every start).
    #[tokio::test(start_paused = true)]
    async fn an_unsynced_clock_long_after_boot_is_trusted_at_once() {
        let h = Harness::new("2026-05-01T08:59:00Z");
        h.clock.synced.store(false, Ordering::SeqCst);
        *h.clock.booted.lock().unwrap() = Some(Duration::from_secs(5 * 3600));
        h.add("nine", parse_cron("0 9 * * *", None).unwrap(), |_| {});
        let run = h.start(h.scheduler().with_sync_wait(Some(Duration::from_secs(600))), None);
        advance(90).await;
        stop(run).await;
        assert_eq!(h.runs().into_iter().map(|r| r.1).collect::<Vec<_>>(), [ts("2026-05-01T09:00:00Z")]);
    }

    /// Booted a minute ago with no sync (a Pi without an RTC): held until the
    /// machine has been up for the wait, not for the wait after the daemon started.
    #[tokio::test(start_paused = true)]
    async fn a_freshly_booted_unsynced_clock_is_held_until_uptime_reaches_the_wait() {
        let h = Harness::new("2026-05-01T08:59:00Z");
        h.clock.synced.store(false, Ordering::SeqCst);
        *h.clock.booted.lock().unwrap() = Some(Duration::from_secs(60));
        h.add("q", parse_cron("*/2 * * * *", None).unwrap(), |_| {});
        let run = h.start(h.scheduler().with_sync_wait(Some(Duration::from_secs(5 * 60))), None);
        advance(8 * 60 + 30).await; // wall 09:07:30; trusted from 09:03 (up 5 min), not 09:04 (5 min after start)
        stop(run).await;
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        // 09:00 passed while held, past the grace: missed. 09:02 is a minute old at 09:03: run then.
        let runs = h.runs.lock().unwrap().clone();
        assert_eq!(runs.iter().map(|r| r.1).collect::<Vec<_>>(), [t("09:02"), t("09:04"), t("09:06")]);
        assert_eq!(runs[0].2, t("09:03"), "released when the machine had been up for the wait");
    }

    /// A clock earlier than what the jobs recorded went back: held as before.
    #[tokio::test(start_paused = true)]
    async fn an_unsynced_clock_behind_the_last_record_is_held() {
        let h = Harness::new("2026-05-01T08:59:00Z");
        h.clock.synced.store(false, Ordering::SeqCst);
        *h.clock.booted.lock().unwrap() = Some(Duration::from_secs(5 * 3600));
        h.add("nine", parse_cron("0 9 * * *", None).unwrap(), |j| {
            j.created = ts("2026-05-03T12:00:00Z"); // written when the clock said the 3rd
        });
        let run = h.start(h.scheduler().with_sync_wait(Some(Duration::from_secs(600))), None);
        advance(5 * 60).await;
        assert!(h.runs().is_empty(), "held: the clock is behind bramble's own record");
        stop(run).await;
        let suspect = engine::clock_suspect(
            ts("2026-05-01T09:00:00Z"),
            false,
            Some(Duration::from_secs(3600)),
            engine::latest_record(&[h.job("nine")]),
            Duration::from_secs(600),
        );
        assert_eq!(suspect, Some(engine::Suspect::Behind { latest: ts("2026-05-03T12:00:00Z") }));
    }

    /// Ten jobs at 09:00 with `--jitter 5m` start spread over the window, each
    /// at its own fixed offset, every day the same; the occurrence recorded
    /// is still 09:00.
    #[tokio::test(start_paused = true)]
    async fn jitter_spreads_jobs_at_a_stable_offset_per_job() {
        let h = Harness::new("2026-05-01T08:59:00Z");
        let mut offsets = Vec::new();
        for i in 0..10 {
            let job = h.add(&format!("j{i}"), parse_cron("0 9 * * *", None).unwrap(), |j| {
                j.jitter = Some(crate::config::Dur::secs(300));
            });
            offsets.push((job.name.clone(), job.jitter_offset()));
        }
        let run = h.start(h.scheduler(), None);
        advance(24 * 3600 + 7 * 60).await; // two days' 09:00
        stop(run).await;
        let runs = h.runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 20);
        for (name, offset) in &offsets {
            assert!(*offset < Duration::from_secs(300), "{name}: {offset:?}");
            let mine: Vec<_> = runs.iter().filter(|r| &r.0 == name).collect();
            for (day, r) in mine.iter().enumerate() {
                let occurrence = ts(&format!("2026-05-0{}T09:00:00Z", day + 1));
                assert_eq!(r.1, occurrence, "{name}: recorded at its occurrence");
                let late = dur_since(r.2, occurrence);
                assert!(
                    late >= *offset && late < *offset + Duration::from_secs(2),
                    "{name}: started {late:?} late, offset {offset:?}"
                );
            }
        }
        let distinct: std::collections::HashSet<_> = offsets.iter().map(|o| o.1.as_secs()).collect();
        assert!(distinct.len() >= 8, "spread out: {offsets:?}");
    }

    /// "Remind me 3 times": three scheduled runs, then done — also when the
    /// process died during the third (it counts when it starts).
    #[tokio::test(start_paused = true)]
    async fn max_runs_and_until_end_a_job() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("thrice", every(60, h.now()), |j| j.max_runs = Some(3));
        h.add("hourly", every(600, h.now()), |j| j.until = Some(ts("2026-05-01T08:25:00Z")));
        let run = h.start(h.scheduler(), None);
        advance(3600).await;
        stop(run).await;
        let count = |n: &str| h.runs().into_iter().filter(|r| r.0 == n).count();
        assert_eq!(count("thrice"), 3);
        assert_eq!(count("hourly"), 2, "08:10 and 08:20; 08:30 is past the end");
        for name in ["thrice", "hourly"] {
            let j = h.job(name);
            assert!(j.state.done && !j.enabled && j.state.next_run.is_none(), "{name}: {:?}", j.state);
        }
        assert_eq!(h.job("thrice").state.runs, 3);

        // A crash during the last run: recorded as interrupted, and the job is done all the same.
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("twice", every(60, h.now()), |j| {
            j.max_runs = Some(2);
            j.state.runs = 2;
            j.state.running_since = Some(ts("2026-05-01T07:59:30Z"));
            j.state.last_run = Some(ts("2026-05-01T07:59:00Z"));
        });
        let run = h.start(h.scheduler(), None);
        advance(300).await;
        stop(run).await;
        assert!(h.runs().is_empty());
        let j = h.job("twice");
        assert!(j.state.done, "{:?}", j.state);
        assert!(j.state.history.back().unwrap().summary.starts_with("interrupted"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_that_never_syncs_is_trusted_after_the_wait() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.clock.synced.store(false, Ordering::SeqCst);
        h.add("q", parse_cron("*/5 * * * *", None).unwrap(), |_| {});
        let run = h.start(h.scheduler().with_sync_wait(Some(Duration::from_secs(12 * 60))), None);
        advance(21 * 60).await;
        stop(run).await;
        let t = |hm: &str| ts(&format!("2026-05-01T{hm}:00Z"));
        assert_eq!(h.runs().into_iter().map(|r| r.1).collect::<Vec<_>>(), [t("08:15"), t("08:20")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cli_edit_is_picked_up_at_once_after_reload() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        let s = h.scheduler();
        let handle = s.handle();
        let run = h.start(s, None);
        advance(1).await; // the loop now sleeps up to 60 s
                          // A second store handle (the CLI) adds a job due in 5 s, then signals.
        h.add("soon", Schedule::at(ts("2026-05-01T08:00:06Z")), |_| {});
        handle.reload();
        advance(20).await;
        stop(run).await;
        let runs = h.runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].2, ts("2026-05-01T08:00:06Z"), "ran at its time, not at the next minute wake");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cli_edit_without_signal_is_seen_on_the_next_wake() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("a", every(3600, h.now()), |_| {});
        let run = h.start(h.scheduler(), None);
        advance(1).await;
        h.store().set_enabled("a", false).unwrap();
        h.add("b", every(30, h.now()), |_| {});
        advance(MAX_SLEEP.as_secs() + 65).await; // the first wake, at 08:05:00, sees the edit
        stop(run).await;
        let runs: Vec<_> = h.runs().into_iter().map(|r| r.1).collect();
        let t = |hms: &str| ts(&format!("2026-05-01T{hms}Z"));
        // The daemon's inotify watch normally says at once; without it the
        // edit waits for the next wake. b's 08:04:31 is seen at 08:05:00
        // (within the grace) and runs, the older ones count as missed; then on time.
        assert_eq!(runs, [t("08:04:31"), t("08:05:01"), t("08:05:31"), t("08:06:01")]);
        assert!(!h.job("a").enabled);
    }

    #[tokio::test(start_paused = true)]
    async fn run_now_runs_outside_the_schedule() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        h.add("daily", parse_cron("0 9 * * *", None).unwrap(), |_| {});
        let s = h.scheduler();
        let handle = s.handle();
        let run = h.start(s, None);
        advance(1).await;
        assert!(handle.run_now("daily"));
        advance(5).await;
        stop(run).await;
        assert_eq!(h.runs(), [("daily".to_string(), ts("2026-05-01T08:00:01Z"))]);
        let job = h.job("daily");
        assert_eq!(job.state.next_run, Some(ts("2026-05-01T09:00:00Z")), "schedule untouched");
        assert_eq!(job.state.last_status, Some(RunStatus::Ok));
    }

    #[tokio::test(start_paused = true)]
    async fn a_corrupt_store_is_kept_aside_and_the_loop_carries_on() {
        let h = Harness::new("2026-05-01T08:00:00Z");
        std::fs::write(h.store().path(), b"not json").unwrap();
        let run = h.start(h.scheduler(), None);
        advance(1).await;
        h.add("after", every(10, h.now()), |_| {});
        advance(MAX_SLEEP.as_secs() + 10).await;
        stop(run).await;
        let kept: Vec<_> = std::fs::read_dir(h.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("jobs.json.corrupt-"))
            .collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(std::fs::read(h.dir.path().join(&kept[0])).unwrap(), b"not json");
        assert!(!h.runs().is_empty(), "a job added after the corruption runs");
    }
}
