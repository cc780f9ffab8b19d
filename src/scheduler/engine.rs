//! The firing rules, as pure functions of (job, wall-clock now).
//!
//! The runner asks [`plan`] about each job on every wake-up and does what the
//! [`Decision`] says; the state changes that follow a decision are the
//! `mark_*` functions. Nothing here sleeps, reads the clock or touches a file,
//! so every rule below is a unit test.
//!
//! ## The rules
//!
//! - **On time vs missed.** An occurrence is *on time* if it is at most
//!   [`GRACE`] (60 s) old when the scheduler sees it; a wake-up a few hundred
//!   milliseconds late, a busy board or a slow store write do not count as a
//!   miss. Older occurrences are *missed* (daemon down, board off, a forward
//!   clock jump, a run that overran its interval).
//! - **Missed runs** follow the job's [`CatchUp`] policy: `skip` records them
//!   and plans the next future occurrence; `once` runs one catch-up for the
//!   whole span (scheduled as its newest occurrence), then plans the next
//!   future one; `Window(d)` is `once` if the newest missed occurrence is at
//!   most `d` old, else `skip`. Every miss is reported as a [`Missed`] (count,
//!   first, last) for the log and the job's history. If the newest occurrence
//!   is on time, it runs and only the older ones are reported missed.
//! - **Backward clock jumps never fire twice.** `last_run` holds the
//!   *scheduled* time of the last occurrence started; an occurrence at or
//!   before it is never planned again, and after a run `next_run` is the first
//!   occurrence after it. When the wall clock goes back, `cron` jobs simply
//!   wait for their next occurrence after `last_run`. `every` jobs do not
//!   pause: the runner measures the jump (wall vs monotonic time) and
//!   re-anchors them ([`reanchor`]): anchor, `last_run` and `next_run` move by
//!   the jump, so the next run comes one interval after the previous one in
//!   monotonic (real elapsed) time. A wall clock found behind an `every` job's
//!   `last_run` without a measured jump (it went back while the daemon was
//!   down) re-anchors on *now*: the next run is one interval from now.
//! - **Recurring runs are at most once per occurrence.** Before a recurring
//!   run starts, `running_since` is set and `last_run` moved to the occurrence
//!   ([`mark_started`]); that small write is batched with whatever else the
//!   same wake-up writes. A recurring job found with `running_since` set (and
//!   not running in this process) was interrupted by a crash, a `kill -9` or a
//!   watchdog kill: its occurrence is *not* run again — it is recorded as an
//!   error "interrupted" ([`Decision::Interrupted`], logged) and the next
//!   occurrence is planned. A run cut short by shutdown is recorded as
//!   `cancelled` and not run again either.
//! - **Untrusted wall clock.** Until the clock is synchronised (see
//!   [`clock_synchronized`]) and past [`TRUST_FLOOR`], `cron` and `at` jobs are
//!   held ([`Decision::Hold`]); `every` jobs keep running.

use std::path::Path;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::job::{CatchUp, Job, RunRecord, RunStatus};
use super::schedule::{dur_since, Schedule};

/// How late an occurrence may be seen and still count as on time.
pub const GRACE: Duration = Duration::from_secs(60);

/// A wall clock earlier than this (2024-01-01T00:00:00Z) is never trusted:
/// a board without an RTC boots in 1970 or at its image's build date.
pub const TRUST_FLOOR: Timestamp = Timestamp::constant(1_704_067_200, 0);

/// How many times a one-shot may be started (the first run and one retry
/// after a crash during it).
pub const MAX_ONE_SHOT_ATTEMPTS: u32 = 2;

/// Missed occurrences are counted up to this many (then reported as "N+").
const COUNT_CAP: u64 = 1000;

/// The wall clock as the scheduler sees it. The daemon uses [`SystemClock`];
/// the tests use a fake whose time can jump.
pub trait Clock: Send + Sync {
    /// The wall-clock time now.
    fn now(&self) -> Timestamp;
    /// Whether the wall clock is known to be right (NTP-synchronised).
    fn synchronized(&self) -> bool;
    /// Time since boot (`CLOCK_BOOTTIME`), if known.
    fn uptime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The real clock: `Timestamp::now()` and [`clock_synchronized`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
    fn synchronized(&self) -> bool {
        clock_synchronized()
    }
    fn uptime(&self) -> Option<std::time::Duration> {
        boot_time()
    }
}

/// Time since boot, suspend included (`CLOCK_BOOTTIME`).
pub fn boot_time() -> Option<std::time::Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    Some(std::time::Duration::from(t))
}

/// Why an unsynchronised wall clock is not trusted for cron and `at` jobs.
///
/// A clock without NTP sync is only *suspect* when there is a reason: it is
/// before [`TRUST_FLOOR`], the machine booted less than `clock_sync_wait` ago
/// (a Pi without an RTC starts in the past until NTP sets it), or it is earlier
/// than the latest time bramble has recorded (a clock that went back, as
/// fake-hwclock reasons). A container, a VM or a board with an RTC whose kernel
/// never reports sync is trusted at once when none of these holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspect {
    /// Before the 2024 floor: certainly wrong.
    BeforeFloor,
    /// Booted `uptime` ago, less than the wait: held until `left` more has passed.
    Booting { uptime: std::time::Duration, left: std::time::Duration },
    /// Earlier than `latest`, a time bramble wrote down before: the clock went back.
    Behind { latest: Timestamp },
    /// Nothing is known of the boot (no `CLOCK_BOOTTIME`): treated as booting.
    Unknown,
}

impl std::fmt::Display for Suspect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Suspect::BeforeFloor => write!(f, "the clock is before {TRUST_FLOOR}"),
            Suspect::Booting { uptime, .. } => {
                write!(f, "the machine booted {} s ago and NTP has not synchronised the clock yet", uptime.as_secs())
            }
            Suspect::Behind { latest } => {
                write!(f, "the clock is earlier than {latest}, a time bramble recorded before")
            }
            Suspect::Unknown => write!(f, "the clock is not NTP-synchronised and the time since boot is unknown"),
        }
    }
}

/// Whether wall-clock jobs must wait for the clock, and why (`None`: trust it).
/// `wait` is `[daemon] clock_sync_wait`.
pub fn clock_suspect(
    now: Timestamp,
    synced: bool,
    uptime: Option<std::time::Duration>,
    latest: Option<Timestamp>,
    wait: std::time::Duration,
) -> Option<Suspect> {
    if now < TRUST_FLOOR {
        return Some(Suspect::BeforeFloor);
    }
    if synced {
        return None;
    }
    if let Some(latest) = latest.filter(|l| now < *l) {
        return Some(Suspect::Behind { latest });
    }
    match uptime {
        None => Some(Suspect::Unknown),
        Some(uptime) if uptime < wait => Some(Suspect::Booting { uptime, left: wait - uptime }),
        Some(_) => None,
    }
}

/// What `bramble status` and `cron add` say of the clock: `None` when cron
/// and `at` jobs run on time, else why they are held and until when (the
/// daemon's own start matters too: a suspect clock is trusted anyway
/// `clock_sync_wait` after the daemon started).
pub fn clock_hold_note(jobs: &[Job], wait: std::time::Duration, tz: &TimeZone) -> Option<String> {
    let now = Timestamp::now();
    let why = clock_suspect(now, clock_synchronized(), boot_time(), latest_record(jobs), wait)?;
    Some(match why {
        Suspect::Booting { left, .. } => {
            let until = now + jiff::SignedDuration::try_from(left).unwrap_or_default();
            format!(
                "{why}: cron and at jobs are held until it is, or until {} at the latest",
                until.to_zoned(tz.clone()).strftime("%H:%M:%S")
            )
        }
        Suspect::BeforeFloor => format!("{why}: cron and at jobs are held until the clock is set"),
        _ => format!(
            "{why}: cron and at jobs are held until it is synchronised, or {} after the daemon starts",
            crate::config::Dur(wait)
        ),
    })
}

/// The latest wall-clock time the jobs record: when one was made, last
/// started or finished a run. Written anyway, so remembering it costs no write.
pub fn latest_record(jobs: &[Job]) -> Option<Timestamp> {
    jobs.iter()
        .flat_map(|j| {
            let finished = j.state.history.back().map(|r| r.finished);
            [Some(j.created), finished, j.state.running_since]
        })
        .flatten()
        .max()
}

/// Whether the system clock is synchronised and plausible.
///
/// True if systemd-timesyncd's marker `/run/systemd/timesync/synchronized`
/// exists, or if the kernel says so: `adjtimex` (read-only) does not return
/// `TIME_ERROR` and `STA_UNSYNC` is clear (set by the kernel until an NTP
/// daemon — timesyncd, chrony, ntpd — disciplines the clock). Never true
/// before [`TRUST_FLOOR`].
pub fn clock_synchronized() -> bool {
    synced_given(Timestamp::now(), || Path::new("/run/systemd/timesync/synchronized").exists(), kernel_says_synced)
}

/// The decision of [`clock_synchronized`], with its probes passed in.
fn synced_given(now: Timestamp, marker: impl FnOnce() -> bool, kernel: impl FnOnce() -> bool) -> bool {
    now >= TRUST_FLOOR && (marker() || kernel())
}

#[cfg(target_os = "linux")]
fn kernel_says_synced() -> bool {
    // SAFETY: `timex` is plain data, all-zero is a valid value, and with
    // `modes == 0` adjtimex only reads the kernel's state into it.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = 0;
    // SAFETY: `tx` is a valid, exclusively borrowed timex; modes 0 only reads.
    let state = unsafe { libc::adjtimex(&mut tx) };
    state != -1 && state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0
}

#[cfg(not(target_os = "linux"))]
fn kernel_says_synced() -> bool {
    false
}

/// Occurrences that passed without a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// How many (at least; see `capped`).
    pub count: u64,
    /// Counting stopped at a cap; there were more.
    pub capped: bool,
    pub first: Timestamp,
    pub last: Timestamp,
}

impl std::fmt::Display for Missed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let more = if self.capped { "+" } else { "" };
        if self.count == 1 {
            write!(f, "missed 1 occurrence at {}", self.first)
        } else {
            write!(f, "missed {}{more} occurrences from {} to {}", self.count, self.first, self.last)
        }
    }
}

/// What to do with a job now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Disabled, done, or no occurrence ahead.
    Idle,
    /// A wall-clock job while the clock is not trusted.
    Hold,
    /// The next occurrence is in the future. If it differs from the job's
    /// stored `next_run`, the runner stores it.
    Wait(Timestamp),
    /// Run the occurrence scheduled for `scheduled` now.
    Run {
        scheduled: Timestamp,
        /// Older occurrences this run covers or passes over.
        missed: Option<Missed>,
        /// A one-shot that was interrupted by a crash and runs again.
        retry: bool,
    },
    /// The occurrences were missed and are not caught up: record, plan `next`
    /// (`None`: a one-shot, which is then done).
    Skip { missed: Missed, next: Option<Timestamp> },
    /// A one-shot interrupted [`MAX_ONE_SHOT_ATTEMPTS`] times: mark it done with an error.
    GiveUp,
    /// A recurring run of `scheduled` was started (written ahead) and never
    /// finished: the process died during it. Record it ([`mark_interrupted`]);
    /// it is not run again.
    Interrupted { scheduled: Timestamp },
    /// `max_runs` reached or the next occurrence past `until`: mark it done.
    Expire,
}

/// Decide what to do with `job` at wall-clock `now`.
///
/// `trusted` says whether the wall clock may be believed (synchronised and
/// past [`TRUST_FLOOR`]). The caller excludes jobs that it is running right now.
pub fn plan(job: &Job, now: Timestamp, default_tz: &TimeZone, trusted: bool) -> Decision {
    if !job.enabled || job.state.done {
        return Decision::Idle;
    }
    // Jitter: the job lives `offset` behind the wall clock, so each occurrence
    // starts that much later; the occurrences themselves (and `last_run`) stay
    // where the schedule puts them. The caller wakes at `next + offset`.
    let now = now.checked_sub(jiff::SignedDuration::try_from(job.jitter_offset()).unwrap_or_default()).unwrap_or(now);
    if job.state.running_since.is_none() && job.max_runs.is_some_and(|m| job.state.runs >= m) {
        return Decision::Expire;
    }
    let sched = &job.schedule;
    if sched.is_wall_clock() && !trusted {
        return Decision::Hold;
    }
    let st = &job.state;
    if let Schedule::At { at, .. } = sched {
        if st.running_since.is_some() {
            // Written ahead, never finished: the process died during the run.
            if st.attempts >= MAX_ONE_SHOT_ATTEMPTS {
                return Decision::GiveUp;
            }
            return Decision::Run { scheduled: *at, missed: None, retry: true };
        }
    } else if st.running_since.is_some() {
        return Decision::Interrupted { scheduled: st.last_run.unwrap_or(now) };
    }
    let floor = st.last_run;
    let next = match (st.next_run, floor) {
        (Some(n), Some(f)) if n <= f => sched.next_after(f, default_tz),
        (Some(n), _) => Some(n),
        // Not planned yet (just enabled): from now, never at or before the last run.
        (None, _) => match sched {
            Schedule::At { at, .. } => Some(*at).filter(|at| floor.is_none_or(|f| *at > f)),
            _ => sched.next_after(floor.map_or(now, |f| f.max(now)), default_tz),
        },
    };
    let Some(next) = next else { return Decision::Idle };
    if job.until.is_some_and(|u| next > u) && job.state.running_since.is_none() {
        return Decision::Expire;
    }
    if next > now {
        return Decision::Wait(next);
    }

    // Due: find the newest occurrence at or before now and the size of the span.
    let latest = sched.last_at_or_before(now, default_tz).filter(|l| *l >= next).unwrap_or(next);
    let (count, capped) = count_span(sched, next, latest, default_tz);
    if dur_since(now, latest) <= GRACE {
        let missed = (count > 1).then(|| Missed {
            count: count - 1,
            capped,
            first: next,
            last: before(sched, latest, default_tz).unwrap_or(next),
        });
        return Decision::Run { scheduled: latest, missed, retry: false };
    }
    let missed = Missed { count, capped, first: next, last: latest };
    let catch_up = match job.catch_up {
        CatchUp::Skip => false,
        CatchUp::Once => true,
        CatchUp::Window(d) => dur_since(now, latest) <= d.get(),
    };
    if catch_up {
        Decision::Run { scheduled: latest, missed: Some(missed), retry: false }
    } else {
        let next = if sched.is_one_shot() { None } else { sched.next_after(now, default_tz) };
        Decision::Skip { missed, next }
    }
}

/// The occurrence just before `t` (for reporting).
fn before(sched: &Schedule, t: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
    let just_before = t.checked_sub(jiff::SignedDuration::from_nanos(1)).ok()?;
    sched.last_at_or_before(just_before, tz)
}

/// How many occurrences lie in `[first, last]` (`first` is one), and whether
/// counting stopped at the cap.
fn count_span(sched: &Schedule, first: Timestamp, last: Timestamp, tz: &TimeZone) -> (u64, bool) {
    if let Schedule::Every { every, .. } = sched {
        let step = every.get().as_nanos().max(1);
        let span = u128::try_from(last.as_nanosecond() - first.as_nanosecond()).unwrap_or(0);
        return (u64::try_from(span / step + 1).unwrap_or(u64::MAX), false);
    }
    let mut count = 1;
    let mut t = first;
    while let Some(n) = sched.next_after(t, tz).filter(|n| *n <= last) {
        count += 1;
        if count >= COUNT_CAP {
            return (count, true);
        }
        t = n;
    }
    (count, false)
}

/// The write-ahead before a scheduled run (the caller stores this *before*
/// starting the run): `running_since`, and for a one-shot `attempts`; for a
/// recurring job also `last_run` (the occurrence) and `next_run`, so a crash
/// during the run can never make this occurrence due again.
pub fn mark_started(job: &mut Job, scheduled: Timestamp, now: Timestamp, default_tz: &TimeZone) {
    job.state.running_since = Some(now);
    if job.schedule.is_one_shot() {
        job.state.attempts = job.state.attempts.saturating_add(1);
    } else {
        let last = job.state.last_run.map_or(scheduled, |l| l.max(scheduled));
        job.state.last_run = Some(last);
        job.state.next_run = job.schedule.next_after(last, default_tz);
    }
}

/// Record a [`Decision::Interrupted`]: an error line in the history, the
/// marker cleared, the next occurrence after the interrupted one planned.
pub fn mark_interrupted(job: &mut Job, scheduled: Timestamp, now: Timestamp, default_tz: &TimeZone) {
    let msg = "interrupted: the daemon stopped during this run (crash, kill or watchdog); not run again";
    let started = job.state.running_since.take().unwrap_or(now);
    job.state.push(RunRecord {
        scheduled,
        started,
        finished: now,
        status: RunStatus::Error,
        summary: msg.into(),
        model: None,
    });
    job.state.last_error = Some(msg.into());
    let last = job.state.last_run.map_or(scheduled, |l| l.max(scheduled));
    job.state.last_run = Some(last);
    job.state.next_run = job.schedule.next_after(last, default_tz);
}

/// Whether an `every` job's `last_run` lies ahead of the wall clock `now`
/// (the clock went back with no measured jump, e.g. while the daemon was
/// down): the shift that re-anchors it on now (see [`reanchor`]).
pub fn behind(job: &Job, now: Timestamp) -> Option<jiff::SignedDuration> {
    match (&job.schedule, job.state.last_run) {
        (Schedule::Every { .. }, Some(last)) if last > now => Some(now.duration_since(last)),
        _ => None,
    }
}

/// Move an `every` job's grid by `by` (a backward clock jump, negative):
/// anchor, `last_run` and `next_run`. Other schedules are left alone.
pub fn reanchor(job: &mut Job, by: jiff::SignedDuration) {
    let Schedule::Every { anchor, .. } = &mut job.schedule else { return };
    fn shift_by(t: Timestamp, by: jiff::SignedDuration) -> Timestamp {
        t.checked_add(by).unwrap_or(t)
    }
    let shift = |t: Timestamp| shift_by(t, by);
    *anchor = shift_by(*anchor, by);
    job.state.last_run = job.state.last_run.map(shift);
    job.state.next_run = job.state.next_run.map(shift);
}

/// Record a [`Decision::Skip`]: a `missed` history line, the new `next_run`;
/// a skipped one-shot is done.
pub fn mark_skipped(job: &mut Job, missed: &Missed, next: Option<Timestamp>, now: Timestamp) {
    job.state.push(missed_record(missed, now));
    job.state.next_run = next;
    if job.schedule.is_one_shot() {
        finish_one_shot(job);
    }
}

/// Record a [`Decision::Expire`]: the job is done (kept, disabled, listed as done).
pub fn mark_expired(job: &mut Job) {
    job.state.done = true;
    job.enabled = false;
    job.state.next_run = None;
}

/// Record a [`Decision::GiveUp`].
pub fn mark_given_up(job: &mut Job, now: Timestamp) {
    let msg = format!(
        "the daemon stopped during this one-shot {} times; not run again",
        job.state.attempts.max(MAX_ONE_SHOT_ATTEMPTS)
    );
    let scheduled = match job.schedule {
        Schedule::At { at, .. } => at,
        _ => now,
    };
    job.state.push(RunRecord {
        scheduled,
        started: now,
        finished: now,
        status: RunStatus::Error,
        summary: msg.clone(),
        model: None,
    });
    job.state.last_error = Some(msg);
    finish_one_shot(job);
}

/// Record a finished run of occurrence `scheduled` (one write with everything).
///
/// A scheduled (not `manual`) run moves `last_run` to `scheduled` and plans
/// `next_run` as the first occurrence after it (occurrences that passed during
/// a long run then go through the catch-up policy). A `manual` run
/// (`bramble cron run`) leaves the schedule alone. A one-shot is done after
/// any finish, ok or error.
#[allow(clippy::too_many_arguments)]
pub fn mark_finished(
    job: &mut Job,
    scheduled: Timestamp,
    started: Timestamp,
    now: Timestamp,
    status: RunStatus,
    summary: &str,
    error: Option<&str>,
    missed: Option<&Missed>,
    manual: bool,
    default_tz: &TimeZone,
) {
    if let Some(m) = missed {
        job.state.push(missed_record(m, started));
    }
    job.state.push(RunRecord { scheduled, started, finished: now, status, summary: summary.to_string(), model: None });
    if status == RunStatus::Cancelled && job.schedule.is_one_shot() {
        // Interrupted by shutdown: a one-shot keeps its write-ahead (tried once
        // more after the restart). A recurring run is at most once: recorded
        // as cancelled below, and the next occurrence is planned.
        return;
    }
    job.state.last_error = error.map(str::to_string);
    job.state.running_since = None;
    if job.schedule.is_one_shot() {
        finish_one_shot(job);
        return;
    }
    if !manual {
        let last = job.state.last_run.map_or(scheduled, |l| l.max(scheduled));
        job.state.last_run = Some(last);
        job.state.next_run = job.schedule.next_after(last, default_tz);
    }
}

fn finish_one_shot(job: &mut Job) {
    job.state.done = true;
    job.enabled = false;
    job.state.running_since = None;
    job.state.next_run = None;
    if let Schedule::At { at, .. } = job.schedule {
        job.state.last_run = Some(at);
    }
}

fn missed_record(m: &Missed, now: Timestamp) -> RunRecord {
    RunRecord {
        scheduled: m.last,
        started: now,
        finished: now,
        status: RunStatus::Missed,
        summary: m.to_string(),
        model: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;
    use crate::scheduler::job::JobKind;
    use crate::scheduler::schedule::{parse_cron, parse_every};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const UTC: TimeZone = TimeZone::UTC;

    fn job(schedule: Schedule, created: &str) -> Job {
        Job::new("j", schedule, JobKind::Remind { text: "x".into() }, vec![], ts(created), &UTC).unwrap()
    }

    /// A daily 09:00 UTC cron job created on May 1st: first run May 1st 09:00.
    fn daily() -> Job {
        job(parse_cron("0 9 * * *", None).unwrap(), "2026-05-01T08:00:00Z")
    }

    fn every_10m() -> Job {
        job(
            Schedule::Every { every: parse_every("10m").unwrap(), anchor: ts("2026-05-01T08:00:00Z") },
            "2026-05-01T08:00:00Z",
        )
    }

    #[test]
    fn waits_until_due_and_runs_on_time() {
        let j = daily();
        assert_eq!(plan(&j, ts("2026-05-01T08:59:59Z"), &UTC, true), Decision::Wait(ts("2026-05-01T09:00:00Z")));
        let run = Decision::Run { scheduled: ts("2026-05-01T09:00:00Z"), missed: None, retry: false };
        assert_eq!(plan(&j, ts("2026-05-01T09:00:00Z"), &UTC, true), run);
        // 1 s late, and up to the grace, is on time, not missed — whatever the policy.
        assert_eq!(plan(&j, ts("2026-05-01T09:00:01Z"), &UTC, true), run);
        assert_eq!(plan(&j, ts("2026-05-01T09:01:00Z"), &UTC, true), run);
    }

    #[test]
    fn skip_policy_skips_the_whole_missed_span() {
        let j = daily(); // catch_up: skip (default for cron)
                         // Down from before May 1st 09:00 until May 4th 12:00: 4 occurrences missed.
        let d = plan(&j, ts("2026-05-04T12:00:00Z"), &UTC, true);
        let missed =
            Missed { count: 4, capped: false, first: ts("2026-05-01T09:00:00Z"), last: ts("2026-05-04T09:00:00Z") };
        assert_eq!(d, Decision::Skip { missed, next: Some(ts("2026-05-05T09:00:00Z")) });
        assert_eq!(missed.to_string(), "missed 4 occurrences from 2026-05-01T09:00:00Z to 2026-05-04T09:00:00Z");
    }

    #[test]
    fn once_policy_runs_one_catch_up_for_the_span() {
        let mut j = daily();
        j.catch_up = CatchUp::Once;
        let d = plan(&j, ts("2026-05-04T12:00:00Z"), &UTC, true);
        let missed =
            Missed { count: 4, capped: false, first: ts("2026-05-01T09:00:00Z"), last: ts("2026-05-04T09:00:00Z") };
        assert_eq!(d, Decision::Run { scheduled: ts("2026-05-04T09:00:00Z"), missed: Some(missed), retry: false });
        // After the catch-up, the next run is the next future occurrence.
        let (s, now) = (ts("2026-05-04T09:00:00Z"), ts("2026-05-04T12:00:05Z"));
        mark_finished(&mut j, s, now, now, RunStatus::Ok, "done", None, Some(&missed), false, &UTC);
        assert_eq!(j.state.last_run, Some(s));
        assert_eq!(j.state.next_run, Some(ts("2026-05-05T09:00:00Z")));
        let statuses: Vec<_> = j.state.history.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [RunStatus::Missed, RunStatus::Ok]);
        assert_eq!(plan(&j, now, &UTC, true), Decision::Wait(ts("2026-05-05T09:00:00Z")));
    }

    #[test]
    fn window_policy_catches_up_only_recent_misses() {
        let mut j = daily();
        j.catch_up = CatchUp::Window(Dur::secs(2 * 3600));
        // Newest missed occurrence (May 1st 09:00) is 1 h old: catch up.
        assert!(matches!(plan(&j, ts("2026-05-01T10:00:00Z"), &UTC, true), Decision::Run { .. }));
        // 3 h old: skip.
        assert!(matches!(plan(&j, ts("2026-05-01T12:00:00Z"), &UTC, true), Decision::Skip { .. }));
    }

    #[test]
    fn an_on_time_occurrence_runs_and_older_ones_are_reported() {
        let j = every_10m(); // next_run 08:10
                             // Down from 08:05 to 10:00:30: 08:10 … 10:00 is 12 occurrences, 10:00 is on time.
        let d = plan(&j, ts("2026-05-01T10:00:30Z"), &UTC, true);
        let missed =
            Missed { count: 11, capped: false, first: ts("2026-05-01T08:10:00Z"), last: ts("2026-05-01T09:50:00Z") };
        assert_eq!(d, Decision::Run { scheduled: ts("2026-05-01T10:00:00Z"), missed: Some(missed), retry: false });
    }

    #[test]
    fn every_jobs_survive_a_forward_jump_under_skip() {
        // The tokio-cron-scheduler #113 failure: after a forward jump the job must keep going.
        let j = every_10m();
        let Decision::Skip { missed, next } = plan(&j, ts("2026-05-01T11:05:00Z"), &UTC, true) else {
            panic!("expected a skip")
        };
        assert_eq!(missed.count, 18); // 08:10 … 11:00
        assert_eq!(next, Some(ts("2026-05-01T11:10:00Z")));
        let mut j = j;
        mark_skipped(&mut j, &missed, next, ts("2026-05-01T11:05:00Z"));
        assert!(j.enabled);
        assert_eq!(
            plan(&j, ts("2026-05-01T11:10:00Z"), &UTC, true),
            Decision::Run { scheduled: ts("2026-05-01T11:10:00Z"), missed: None, retry: false }
        );
    }

    #[test]
    fn a_backward_jump_never_fires_an_occurrence_twice() {
        let mut j = daily();
        let s = ts("2026-05-01T09:00:00Z");
        mark_finished(&mut j, s, s, s, RunStatus::Ok, "", None, None, false, &UTC);
        // Clock set back an hour, then forward past 09:00 again: the same occurrence never reruns.
        for now in ["2026-05-01T08:00:00Z", "2026-05-01T09:00:00Z", "2026-05-01T09:00:30Z"] {
            assert_eq!(plan(&j, ts(now), &UTC, true), Decision::Wait(ts("2026-05-02T09:00:00Z")), "{now}");
        }
        // Even if a hand edit put next_run back before last_run.
        j.state.next_run = Some(ts("2026-05-01T09:00:00Z"));
        assert_eq!(plan(&j, ts("2026-05-01T09:00:30Z"), &UTC, true), Decision::Wait(ts("2026-05-02T09:00:00Z")));
        // And re-enabling (next_run None) plans after max(now, last_run).
        j.state.next_run = None;
        assert_eq!(plan(&j, ts("2026-05-01T08:00:00Z"), &UTC, true), Decision::Wait(ts("2026-05-02T09:00:00Z")));
    }

    #[test]
    fn enabling_plans_from_now_without_missed_runs() {
        let mut j = daily();
        j.state.next_run = None; // what JobStore::set_enabled(true) leaves
        assert_eq!(plan(&j, ts("2026-05-10T12:00:00Z"), &UTC, true), Decision::Wait(ts("2026-05-11T09:00:00Z")));
    }

    #[test]
    fn untrusted_clock_holds_wall_clock_jobs_only() {
        assert_eq!(plan(&daily(), ts("2026-05-01T09:00:00Z"), &UTC, false), Decision::Hold);
        let at = job(Schedule::at(ts("2026-05-01T09:00:00Z")), "2026-05-01T08:00:00Z");
        assert_eq!(plan(&at, ts("2026-05-01T09:00:00Z"), &UTC, false), Decision::Hold);
        assert!(matches!(plan(&every_10m(), ts("2026-05-01T08:10:00Z"), &UTC, false), Decision::Run { .. }));
    }

    #[test]
    fn disabled_and_done_jobs_are_idle() {
        let mut j = daily();
        j.enabled = false;
        assert_eq!(plan(&j, ts("2026-05-01T09:00:00Z"), &UTC, true), Decision::Idle);
        let mut at = job(Schedule::at(ts("2026-05-01T09:00:00Z")), "2026-05-01T08:00:00Z");
        at.state.done = true;
        assert_eq!(plan(&at, ts("2026-05-01T09:00:00Z"), &UTC, true), Decision::Idle);
    }

    #[test]
    fn one_shot_missed_is_caught_up_once_by_default_or_skipped_and_done() {
        let at = job(Schedule::at(ts("2026-05-01T09:00:00Z")), "2026-05-01T08:00:00Z");
        let d = plan(&at, ts("2026-05-02T07:00:00Z"), &UTC, true);
        assert!(
            matches!(d, Decision::Run { scheduled, missed: Some(Missed { count: 1, .. }), retry: false } if scheduled == ts("2026-05-01T09:00:00Z")),
            "{d:?}"
        );
        let mut skip = at.clone();
        skip.catch_up = CatchUp::Skip;
        let Decision::Skip { missed, next: None } = plan(&skip, ts("2026-05-02T07:00:00Z"), &UTC, true) else {
            panic!("expected a final skip")
        };
        mark_skipped(&mut skip, &missed, None, ts("2026-05-02T07:00:00Z"));
        assert!(skip.state.done && !skip.enabled);
        assert_eq!(skip.state.last_status, Some(RunStatus::Missed));
    }

    #[test]
    fn one_shot_write_ahead_then_crash_retries_once_then_gives_up() {
        let mut at = job(Schedule::at(ts("2026-05-01T09:00:00Z")), "2026-05-01T08:00:00Z");
        let now = ts("2026-05-01T09:00:00Z");
        mark_started(&mut at, now, now, &UTC);
        assert_eq!((at.state.running_since, at.state.attempts), (Some(now), 1));
        // "Restart": the marker is found; it runs again, once, whatever the policy.
        at.catch_up = CatchUp::Skip;
        let later = ts("2026-05-03T00:00:00Z");
        assert_eq!(plan(&at, later, &UTC, true), Decision::Run { scheduled: now, missed: None, retry: true });
        mark_started(&mut at, now, later, &UTC);
        assert_eq!(plan(&at, later, &UTC, true), Decision::GiveUp);
        mark_given_up(&mut at, later);
        assert!(at.state.done && !at.enabled && at.state.running_since.is_none());
        assert_eq!(at.state.last_status, Some(RunStatus::Error));
        assert_eq!(plan(&at, later, &UTC, true), Decision::Idle);
    }

    #[test]
    fn a_recurring_run_interrupted_by_a_crash_is_not_run_again() {
        let mut j = daily();
        let s = ts("2026-05-01T09:00:00Z");
        // Started (written ahead), then the process died: the restart 10 s later
        // is within the grace, yet the occurrence is recorded, not rerun.
        mark_started(&mut j, s, s, &UTC);
        let later = ts("2026-05-01T09:00:10Z");
        assert_eq!(plan(&j, later, &UTC, true), Decision::Interrupted { scheduled: s });
        mark_interrupted(&mut j, s, later, &UTC);
        assert_eq!(j.state.running_since, None);
        assert_eq!(j.state.last_status, Some(RunStatus::Error));
        assert!(j.state.history[0].summary.starts_with("interrupted"));
        assert_eq!(plan(&j, later, &UTC, true), Decision::Wait(ts("2026-05-02T09:00:00Z")));
        // A shutdown-cancelled recurring run is recorded and not rerun either.
        let s2 = ts("2026-05-02T09:00:00Z");
        mark_started(&mut j, s2, s2, &UTC);
        mark_finished(&mut j, s2, s2, s2, RunStatus::Cancelled, "stop", None, None, false, &UTC);
        assert_eq!(j.state.running_since, None);
        assert_eq!(plan(&j, s2, &UTC, true), Decision::Wait(ts("2026-05-03T09:00:00Z")));
    }

    #[test]
    fn reanchoring_an_every_job_keeps_its_interval() {
        let mut j = every_10m();
        let s = ts("2026-05-01T08:10:00Z");
        mark_started(&mut j, s, s, &UTC);
        mark_finished(&mut j, s, s, s, RunStatus::Ok, "", None, None, false, &UTC);
        // The clock goes back 65 s: the next run is 10 min after the previous
        // one in real time, i.e. at 08:18:55 on the new wall clock.
        reanchor(&mut j, jiff::SignedDuration::from_secs(-65));
        assert_eq!(plan(&j, ts("2026-05-01T08:10:00Z"), &UTC, true), Decision::Wait(ts("2026-05-01T08:18:55Z")));
        // Behind last_run with no measured jump: re-anchored on now.
        let mut k = every_10m();
        mark_finished(&mut k, s, s, s, RunStatus::Ok, "", None, None, false, &UTC);
        let now = ts("2026-05-01T07:10:00Z");
        let by = behind(&k, now).unwrap();
        reanchor(&mut k, by);
        assert_eq!(plan(&k, now, &UTC, true), Decision::Wait(ts("2026-05-01T07:20:00Z")));
        assert_eq!(behind(&daily(), now), None);
    }

    #[test]
    fn a_finished_one_shot_is_done_even_on_error() {
        let mut at = job(Schedule::at(ts("2026-05-01T09:00:00Z")), "2026-05-01T08:00:00Z");
        let now = ts("2026-05-01T09:00:00Z");
        mark_started(&mut at, now, now, &UTC);
        mark_finished(&mut at, now, now, now, RunStatus::Error, "", Some("no network"), None, false, &UTC);
        assert!(at.state.done && !at.enabled && at.state.running_since.is_none());
        assert_eq!(at.state.last_error.as_deref(), Some("no network"));
        assert_eq!(plan(&at, now, &UTC, true), Decision::Idle);
    }

    #[test]
    fn a_manual_run_leaves_the_schedule_alone() {
        let mut j = daily();
        let now = ts("2026-05-01T08:30:00Z");
        mark_finished(&mut j, now, now, now, RunStatus::Ok, "by hand", None, None, true, &UTC);
        assert_eq!(j.state.last_run, None);
        assert_eq!(j.state.next_run, Some(ts("2026-05-01T09:00:00Z")));
        assert_eq!(j.state.history.len(), 1);
    }

    #[test]
    fn dst_cron_in_the_engine_berlin_gap_and_repeat() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        let mut j = job(parse_cron("30 2 * * *", None).unwrap(), "2026-03-28T12:00:00Z");
        j.state.next_run = j.schedule.next_after(ts("2026-03-28T12:00:00Z"), &berlin);
        // Spring forward: 02:30 does not exist on 03-29; it runs at 03:00 CEST (01:00Z), once.
        assert_eq!(plan(&j, ts("2026-03-29T00:59:59Z"), &berlin, true), Decision::Wait(ts("2026-03-29T01:00:00Z")));
        let s = ts("2026-03-29T01:00:00Z");
        assert!(matches!(plan(&j, s, &berlin, true), Decision::Run { scheduled, .. } if scheduled == s));
        mark_finished(&mut j, s, s, s, RunStatus::Ok, "", None, None, false, &berlin);
        assert_eq!(j.state.next_run, Some(ts("2026-03-30T00:30:00Z")));
        // Fall back: 02:30 happens twice on 10-25; only the first runs.
        let s = ts("2026-10-25T00:30:00Z");
        j.state.next_run = Some(s);
        mark_finished(&mut j, s, s, s, RunStatus::Ok, "", None, None, false, &berlin);
        assert_eq!(plan(&j, ts("2026-10-25T01:30:00Z"), &berlin, true), Decision::Wait(ts("2026-10-26T01:30:00Z")));
    }

    #[test]
    fn huge_cron_spans_are_counted_with_a_cap() {
        // Hourly at :30, down for two months: ~1460 missed, counted to the cap.
        let j = job(parse_cron("30 * * * *", None).unwrap(), "2026-05-01T08:00:00Z");
        let d = plan(&j, ts("2026-07-01T08:00:00Z"), &UTC, true);
        let Decision::Skip { missed, next } = d else { panic!("expected a skip, got {d:?}") };
        assert!(missed.capped && missed.count == COUNT_CAP, "{missed:?}");
        assert_eq!((missed.first, missed.last), (ts("2026-05-01T08:30:00Z"), ts("2026-07-01T07:30:00Z")));
        assert_eq!(next, Some(ts("2026-07-01T08:30:00Z")));
        assert!(missed.to_string().contains("1000+"));
    }

    #[test]
    fn the_sync_probe_never_trusts_a_clock_before_the_floor() {
        let yes = || true;
        let no = || false;
        assert!(!synced_given(ts("1970-01-01T00:00:10Z"), yes, yes));
        assert!(!synced_given(ts("2023-12-31T23:59:59Z"), yes, yes));
        assert!(synced_given(ts("2024-01-01T00:00:00Z"), yes, no));
        assert!(synced_given(ts("2026-05-01T00:00:00Z"), no, yes));
        assert!(!synced_given(ts("2026-05-01T00:00:00Z"), no, no));
    }

    #[test]
    fn an_unsynced_clock_is_suspect_only_for_a_reason() {
        let now = ts("2026-05-01T09:00:00Z");
        let wait = Duration::from_secs(600);
        let up = |s| Some(Duration::from_secs(s));
        assert_eq!(clock_suspect(now, true, up(5), None, wait), None, "synchronised");
        assert_eq!(
            clock_suspect(now, false, up(7200), Some(ts("2026-05-01T08:00:00Z")), wait),
            None,
            "up long, past the record"
        );
        assert_eq!(
            clock_suspect(now, false, up(120), None, wait),
            Some(Suspect::Booting { uptime: Duration::from_secs(120), left: Duration::from_secs(480) })
        );
        let latest = ts("2026-05-02T00:00:00Z");
        assert_eq!(clock_suspect(now, false, up(7200), Some(latest), wait), Some(Suspect::Behind { latest }));
        assert_eq!(clock_suspect(now, false, None, None, wait), Some(Suspect::Unknown));
        assert_eq!(clock_suspect(ts("2020-01-01T00:00:00Z"), true, up(7200), None, wait), Some(Suspect::BeforeFloor));
        assert!(Suspect::Behind { latest }.to_string().contains("earlier than 2026-05-02T00:00:00Z"));
    }
}
