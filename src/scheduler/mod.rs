//! The scheduler: cron jobs, intervals, one-shot reminders.
//!
//! ## Why our own loop
//!
//! The design named `tokio-cron-scheduler`. It breaks four of our rules:
//!
//! | Rule | tokio-cron-scheduler | here |
//! |------|----------------------|------|
//! | Jobs survive a forward clock jump (NTP sync after boot) | repeated jobs stop forever (issue #113, fix unmerged) | missed occurrences go through the job's [`CatchUp`] policy, then the next *future* occurrence is planned ([`engine::plan`]) |
//! | Time zones are real zones | frozen to the UTC offset at creation: drifts an hour at DST (#107) | cron is evaluated by croner on a `jiff::Zoned` in the job's IANA zone on every step, so DST is honoured |
//! | Idle means idle | 500 ms polling tick, ~120 wake-ups a minute | one kernel timer until the earliest due job, capped at 5 min, and a wake-up when the wall clock is stepped: ≤ 0.2 wake-ups a minute when nothing is due |
//! | current_thread runtime, testable with `tokio::time::pause` | needs a multi-thread runtime, hangs on current_thread | plain tasks on any runtime; the tests run on paused time with a fake wall clock |
//! | Small binary | forces chrono-tz (+1.7 MB) | jiff reads the system tzdb (`/usr/share/zoneinfo`) |
//!
//! Cron expressions are parsed and evaluated by `croner` (jiff backend); the
//! timing is ours: the monotonic timer decides *when to look*, the wall clock
//! decides *what is due*, and a difference between the two is a clock jump.
//!
//! ## Layout
//!
//! - [`schedule`]: what a schedule is (`every`, `cron`, `at`), parsing, next occurrence.
//! - [`job`]: a job, its delivery, its catch-up policy and its run state.
//! - [`store`]: `jobs.json` with atomic writes and a lock shared with the CLI.
//! - [`engine`]: the firing rules as pure functions; the wall-clock probe.
//! - [`actor`]: the loop that sleeps, wakes, plans and hands due jobs to an executor.

pub mod actor;
pub mod cron;
pub mod engine;
pub mod heartbeat;
pub mod job;
pub mod schedule;
pub mod store;
mod timeser;

pub use actor::{BoxFuture, Incident, JobExecutor, RunOutcome, Scheduler, SchedulerHandle, SchedulerLoop};
pub use engine::{clock_synchronized, plan, Clock, Decision, Missed, SystemClock, GRACE};
pub use job::{
    CatchUp, Job, JobError, JobKind, JobState, Placement, RunRecord, RunStatus, Watch, WatchMode, WatchSeen,
};
pub use schedule::{parse_at, parse_cron, parse_every, parse_tz, Schedule, ScheduleError};
pub use store::{JobStore, Stamp, StoreError};
