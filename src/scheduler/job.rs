//! A job: what runs, when, where its output goes, and what happened last time.
//!
//! The job is the unit the CLI edits and the daemon runs, and it is stored as
//! JSON, so everything here is plain data with serde. Its [`JobState`] is the
//! scheduler's memory across restarts: the next planned run, the *scheduled*
//! time of the last occurrence handled (the guard against double runs after a
//! backward clock jump), a short history, and the write-ahead marker that makes
//! a one-shot run exactly once and a recurring occurrence at most once, even
//! across a crash.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::str::FromStr;

use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::schedule::{Schedule, ScheduleError};
use crate::bus::{Conversation, Principal, Target};
use crate::config::Dur;

/// Where a job runs in a fleet (docs/fleet.md): stored and scheduled on that
/// board, with its clock, zone, catch-up rules and sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// This board's own job (every job outside a fleet).
    #[default]
    Local,
    /// Pinned to a board (`cron add --on garage`): the primary sent it there.
    Board(crate::config::fleet::BoardName),
    /// Whichever board wins the slot (`--on any`, Tier 3: needs `[fleet] nats_url`).
    Any,
}

impl Placement {
    pub fn is_local(&self) -> bool {
        matches!(self, Placement::Local)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Local => f.write_str("local"),
            Placement::Board(b) => write!(f, "{b}"),
            Placement::Any => f.write_str("any"),
        }
    }
}

/// At most this many run records are kept per job.
pub const HISTORY_LEN: usize = 10;
/// A run summary is cut to this many characters.
pub const SUMMARY_LEN: usize = 200;

/// Why a job could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("`{0}` is not a job name: expected 1 to 64 characters from `A-Z a-z 0-9 _ -`, like `morning-report`")]
    Name(String),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("the time {0} is already past; a one-shot job needs a time in the future")]
    AtInPast(Timestamp),
    #[error("`{0}` is not a catch-up policy: expected `skip`, `once` or a window like `2h`")]
    CatchUp(String),
    #[error("a job needs something to do: the text or command is empty")]
    Empty,
}

/// What a job does when it fires. The runner does not interpret it: it hands
/// the job to the executor (the agent, the sandbox) supplied by the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobKind {
    /// A prompt for the agent; its answer is delivered.
    Message { text: String },
    /// A fixed text delivered as is (no model call).
    Remind { text: String },
    /// A shell command run in the sandbox; its output is delivered.
    Exec { command: String },
}

/// A watcher: a command run on the job's schedule whose output decides
/// whether the job's agent turn runs at all (`cron add --watch`). Most polls
/// find nothing new and cost no model call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    pub command: String,
    #[serde(default)]
    pub mode: WatchMode,
}

/// When a watcher's turn runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchMode {
    /// The output is not empty and differs from the last run's.
    #[default]
    Changed,
    /// The output is not empty.
    Nonempty,
    /// The command failed (exit status not 0).
    ExitNonzero,
}

impl WatchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchMode::Changed => "changed",
            WatchMode::Nonempty => "nonempty",
            WatchMode::ExitNonzero => "exit-nonzero",
        }
    }
}

impl FromStr for WatchMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "changed" => Ok(WatchMode::Changed),
            "nonempty" => Ok(WatchMode::Nonempty),
            "exit-nonzero" => Ok(WatchMode::ExitNonzero),
            other => Err(format!("`{other}` is not a watch mode: expected changed, nonempty or exit-nonzero")),
        }
    }
}

/// What a watcher saw last: a hash of the whole output (to compare) and its
/// start (for `{previous}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSeen {
    pub hash: String,
    pub output: String,
}

/// Characters of a watcher's last output kept in the job state.
pub const WATCH_KEPT: usize = 2000;

impl WatchSeen {
    pub fn of(output: &str) -> WatchSeen {
        WatchSeen { hash: fnv1a(output.trim()), output: truncate(output.trim(), WATCH_KEPT) }
    }
}

/// FNV-1a 64 as hex: stable across builds and Rust versions (std's hasher is not).
fn fnv1a(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What to do with occurrences that passed while the daemon could not run
/// them (board off, daemon down, a forward clock jump).
///
/// Written `skip`, `once`, or a duration (`2h`): catch up once if the newest
/// missed occurrence is at most that old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Record them as missed; plan the next future occurrence.
    Skip,
    /// Run once for the whole missed span, then plan the next future occurrence.
    Once,
    /// Like `Once` if the newest missed occurrence is not older than this, else `Skip`.
    Window(Dur),
}

impl CatchUp {
    /// The default: `Skip` for recurring schedules, `Once` for one-shots
    /// (a reminder is still worth delivering late).
    pub fn default_for(schedule: &Schedule) -> CatchUp {
        if schedule.is_one_shot() {
            CatchUp::Once
        } else {
            CatchUp::Skip
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatchUp::Skip => f.write_str("skip"),
            CatchUp::Once => f.write_str("once"),
            CatchUp::Window(d) => write!(f, "{d}"),
        }
    }
}

impl FromStr for CatchUp {
    type Err = JobError;
    fn from_str(text: &str) -> Result<Self, JobError> {
        match text.trim() {
            "skip" => Ok(CatchUp::Skip),
            "once" => Ok(CatchUp::Once),
            other => other.parse::<Dur>().map(CatchUp::Window).map_err(|_| JobError::CatchUp(text.to_string())),
        }
    }
}

impl Serialize for CatchUp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CatchUp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// How one run (or one missed span) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    Error,
    /// Not run on purpose (e.g. the executor declined: quiet hours).
    Skipped,
    /// Occurrences that passed without a run, per the catch-up policy.
    Missed,
    /// Interrupted by shutdown: a one-shot is tried again after the restart.
    Cancelled,
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Skipped => "skipped",
            RunStatus::Missed => "missed",
            RunStatus::Cancelled => "cancelled",
        })
    }
}

/// One line of a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The occurrence this run was for (for a missed span: its newest occurrence).
    #[serde(with = "super::timeser::ts")]
    pub scheduled: Timestamp,
    #[serde(with = "super::timeser::ts")]
    pub started: Timestamp,
    #[serde(with = "super::timeser::ts")]
    pub finished: Timestamp,
    pub status: RunStatus,
    /// At most [`SUMMARY_LEN`] characters.
    pub summary: String,
    /// Which model answered (`provider/model`), for runs of a fallback chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// What the scheduler remembers about a job between runs and restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobState {
    /// The next planned occurrence. `None` on an enabled job means "plan it
    /// from now" (set by `enable`); the daemon fills it in.
    #[serde(with = "super::timeser::opt_ts")]
    pub next_run: Option<Timestamp>,
    /// The *scheduled* time of the last occurrence that was started. An occurrence
    /// at or before it is never run again, whatever the wall clock says.
    #[serde(with = "super::timeser::opt_ts")]
    pub last_run: Option<Timestamp>,
    pub last_status: Option<RunStatus>,
    pub last_error: Option<String>,
    /// Set (and written) before a scheduled run starts; cleared when it
    /// finishes. Found set at startup, it means the process died during the
    /// run: a one-shot is retried once, a recurring occurrence is recorded as
    /// interrupted and not rerun.
    #[serde(with = "super::timeser::opt_ts")]
    pub running_since: Option<Timestamp>,
    /// How many times a one-shot was started (the write-ahead counter).
    pub attempts: u32,
    /// Newest last, at most [`HISTORY_LEN`].
    pub history: VecDeque<RunRecord>,
    /// A one-shot that has run to completion; it never runs again.
    pub done: bool,
    /// A watcher's last output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchSeen>,
    /// Scheduled runs started (for `max_runs`; manual runs do not count).
    #[serde(skip_serializing_if = "is_zero")]
    pub runs: u32,
    /// Runs that failed in a row (reset by a successful one), for alerts.
    #[serde(skip_serializing_if = "is_zero")]
    pub failures: u32,
}

/// An optional duration as `jobs.json` writes it: `"5m"`.
mod opt_dur {
    use super::Dur;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Dur>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(d),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Dur>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => text.parse::<Dur>().map(Some).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl JobState {
    /// After the run just recorded (the newest record): which model
    /// answered, and what a watcher saw (kept for the next run).
    pub fn note_run(&mut self, model: Option<&str>, watch: Option<&WatchSeen>) {
        if let Some(record) = self.history.back_mut() {
            record.model = model.map(str::to_string);
        }
        if let Some(seen) = watch {
            self.watch = Some(seen.clone());
        }
    }

    /// Append a record, keeping the newest [`HISTORY_LEN`], and set `last_status`.
    pub fn push(&mut self, mut record: RunRecord) {
        record.summary = truncate(&record.summary, SUMMARY_LEN);
        match record.status {
            RunStatus::Error => self.failures = self.failures.saturating_add(1),
            RunStatus::Ok => self.failures = 0,
            RunStatus::Skipped | RunStatus::Missed | RunStatus::Cancelled => {}
        }
        self.last_status = Some(record.status);
        self.history.push_back(record);
        while self.history.len() > HISTORY_LEN {
            self.history.pop_front();
        }
    }
}

/// A scheduled job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// 8 lowercase hex characters, random.
    pub id: String,
    /// Unique, `[A-Za-z0-9_-]{1,64}` (it appears in MQTT topics).
    pub name: String,
    pub schedule: Schedule,
    pub kind: JobKind,
    #[serde(default)]
    pub deliver: Vec<Target>,
    pub catch_up: CatchUp,
    pub enabled: bool,
    #[serde(with = "super::timeser::ts")]
    pub created: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The conversation the job was made in, so a reminder set from a
    /// Telegram chat answers there (and its turns continue that session).
    pub origin: Option<Conversation>,
    /// Who made it: its turns act for them, with no tool they may not use
    /// now, and it stops running when their rights end (`bramble pair
    /// --revoke`). `None` in jobs stored before bramble recorded it: see
    /// [`Job::made_by`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<Principal>,
    /// A Home Assistant button runs it (`cron add --ha-button`; with
    /// `[mqtt] discovery`, at most [`crate::channels::mqtt::discovery::MAX_BUTTONS`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ha_button: bool,
    /// The model its turns use (`provider/model`, `cron add --model`), still
    /// with `[agent] fallback` behind it; `None`: the configured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Run this command first; the turn runs only when its output says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<Watch>,
    /// Start each occurrence this much later at most: an offset inside the
    /// window, fixed per job ([`Job::jitter_offset`]), so jobs set for the same
    /// minute do not all call the model in the same second.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_dur")]
    pub jitter: Option<Dur>,
    /// Done after this many scheduled runs ("remind me 3 times").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u32>,
    /// Done when the next occurrence would be after this ("every hour until Friday").
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::timeser::opt_ts")]
    pub until: Option<Timestamp>,
    /// Workspace files sent with each report (`cron add --attach`): a chart
    /// an exec job draws, say. Read when the report is delivered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
    /// Which board runs it (`cron add --on`); a job of a board on its own is `Local`.
    #[serde(default, skip_serializing_if = "Placement::is_local")]
    pub placement: Placement,
    #[serde(default)]
    pub state: JobState,
}

impl Job {
    /// Where this job's report goes: its targets, else the chat it was made in, else the log.
    pub fn report_targets(&self) -> Vec<Target> {
        if !self.deliver.is_empty() {
            return self.deliver.clone();
        }
        // A job made in the terminal has no terminal to report to later: the log.
        let origin = self.origin.as_ref().map(Conversation::reply_target).filter(|t| *t != Target::Cli);
        vec![origin.unwrap_or(Target::Log)]
    }

    /// Who made it: [`Job::creator`], or for a job stored before that was
    /// recorded, the user of the private Telegram chat it was made in (the
    /// chat's id is theirs) and otherwise the owner (the terminal, the CLI
    /// and, as before, group chats).
    pub fn made_by(&self) -> Principal {
        if let Some(p) = &self.creator {
            return p.clone();
        }
        match &self.origin {
            Some(o) if o.channel == crate::bus::Channel::Telegram => match o.chat_id.parse::<i64>() {
                Ok(id) if id > 0 => Principal::Telegram(id),
                _ => Principal::Owner,
            },
            _ => Principal::Owner,
        }
    }

    /// [`report_targets`](Job::report_targets) as text, for messages.
    pub fn report_target_names(&self) -> Vec<String> {
        self.report_targets().iter().map(ToString::to_string).collect()
    }

    /// A new, enabled job with a fresh id, the default catch-up policy for
    /// its schedule, and its first run planned from `now`.
    ///
    /// Checks the name, the schedule, that there is something to do, and that
    /// a one-shot is in the future.
    pub fn new(
        name: &str,
        schedule: Schedule,
        kind: JobKind,
        deliver: Vec<Target>,
        now: Timestamp,
        default_tz: &TimeZone,
    ) -> Result<Job, JobError> {
        check_name(name)?;
        schedule.validate()?;
        let empty = match &kind {
            JobKind::Message { text } | JobKind::Remind { text } => text.trim().is_empty(),
            JobKind::Exec { command } => command.trim().is_empty(),
        };
        if empty {
            return Err(JobError::Empty);
        }
        if let Schedule::At { at, .. } = schedule {
            if at <= now {
                return Err(JobError::AtInPast(at));
            }
        }
        let next_run = schedule.next_after(now, default_tz);
        Ok(Job {
            id: new_id(),
            name: name.to_string(),
            catch_up: CatchUp::default_for(&schedule),
            schedule,
            kind,
            deliver,
            enabled: true,
            created: now,
            origin: None,
            creator: None,
            ha_button: false,
            model: None,
            watch: None,
            jitter: None,
            max_runs: None,
            until: None,
            attach: Vec::new(),
            placement: Placement::Local,
            state: JobState { next_run, ..JobState::default() },
        })
    }

    /// This job's start offset inside its `jitter` window: from its id, so the
    /// same for every occurrence and across restarts, different between jobs.
    /// Whole seconds, less than the window; zero without jitter.
    pub fn jitter_offset(&self) -> std::time::Duration {
        let window = self.jitter.map_or(0, |j| j.get().as_secs());
        if window == 0 {
            return std::time::Duration::ZERO;
        }
        let h = u64::from_str_radix(&fnv1a(&self.id), 16).unwrap_or(0);
        std::time::Duration::from_secs(h % window)
    }

    /// Whether `key` names this job (its id or its name).
    pub fn matches(&self, key: &str) -> bool {
        self.id == key || self.name == key
    }
}

/// Check an `attach` path: relative, inside the workspace (`..` may not climb
/// out), at most 10 of them. Whether the file exists is seen at delivery.
pub fn check_attach(paths: &[String]) -> Result<(), AttachError> {
    if paths.len() > 10 {
        return Err(AttachError::TooMany);
    }
    for p in paths {
        let path = std::path::Path::new(p);
        let mut depth = 0i32;
        for c in path.components() {
            match c {
                std::path::Component::Normal(_) => depth += 1,
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => depth -= 1,
                _ => return Err(AttachError::NotRelative(p.clone())),
            }
            if depth < 0 {
                return Err(AttachError::Leaves(p.clone()));
            }
        }
        if depth == 0 {
            return Err(AttachError::NotAFile(p.clone()));
        }
    }
    Ok(())
}

/// Why a job's `attach` list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("at most 10 attachments per job")]
    TooMany,
    #[error("`{0}`: attachments are paths relative to the workspace")]
    NotRelative(String),
    #[error("`{0}` leaves the workspace")]
    Leaves(String),
    #[error("`{0}` is not a file path")]
    NotAFile(String),
}

/// Check a job name: `[A-Za-z0-9_-]{1,64}`.
pub fn check_name(name: &str) -> Result<(), JobError> {
    let ok =
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(JobError::Name(name.to_string()))
    }
}

/// A fresh job id: 8 hex characters from `/dev/urandom`, or — if that cannot
/// be read — from the time, the pid and a counter mixed by a 64-bit hash.
pub fn new_id() -> String {
    let mut buf = [0u8; 4];
    let random = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).is_ok();
    if !random {
        let mut x = Timestamp::now().as_nanosecond() as u64
            ^ (u64::from(std::process::id()) << 32)
            ^ crate::util::unique::next().wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // splitmix64 finaliser
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        buf = (x as u32).to_be_bytes();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Cut `s` to at most `max` characters, marking the cut with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_stay_in_the_workspace() {
        assert!(check_attach(&["chart.png".into(), "out/./day.csv".into(), "a/../b.txt".into()]).is_ok());
        for bad in ["../etc/passwd", "/etc/passwd", "a/../..", ".", ""] {
            assert!(check_attach(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert!(check_attach(&vec!["a".to_string(); 11]).is_err());
    }
    use crate::scheduler::schedule::{parse_cron, parse_every};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn remind(text: &str) -> JobKind {
        JobKind::Remind { text: text.into() }
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "morning-report", "Job_2", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "has space", "slash/y", "plus+", "ü", &"x".repeat(65)] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains("not a job name"), "{bad}: {err}");
        }
    }

    #[test]
    fn ids_are_8_hex_and_differ() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 8);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn new_job_plans_its_first_run_and_default_policy() {
        let now = ts("2026-05-01T10:00:00Z");
        let utc = TimeZone::UTC;
        let sched = Schedule::Every { every: parse_every("10m").unwrap(), anchor: now };
        let j = Job::new("tick", sched, remind("hi"), vec![Target::Log], now, &utc).unwrap();
        assert_eq!(j.state.next_run, Some(ts("2026-05-01T10:10:00Z")));
        assert_eq!(j.catch_up, CatchUp::Skip);
        assert!(j.enabled && !j.state.done);

        let at = Schedule::at(ts("2026-05-02T08:00:00Z"));
        let j = Job::new("wake", at, remind("up"), vec![], now, &utc).unwrap();
        assert_eq!(j.catch_up, CatchUp::Once);
        assert_eq!(j.state.next_run, Some(ts("2026-05-02T08:00:00Z")));

        let past = Schedule::at(ts("2026-05-01T09:00:00Z"));
        assert!(matches!(Job::new("late", past, remind("x"), vec![], now, &utc), Err(JobError::AtInPast(_))));
        let cron = parse_cron("0 9 * * *", None).unwrap();
        assert_eq!(
            Job::new("bad name", cron.clone(), remind("x"), vec![], now, &utc).unwrap_err().to_string(),
            "`bad name` is not a job name: expected 1 to 64 characters from `A-Z a-z 0-9 _ -`, like `morning-report`"
        );
        assert_eq!(Job::new("empty", cron, remind("  "), vec![], now, &utc), Err(JobError::Empty));
    }

    #[test]
    fn catch_up_parses_and_round_trips() {
        assert_eq!("skip".parse::<CatchUp>().unwrap(), CatchUp::Skip);
        assert_eq!("once".parse::<CatchUp>().unwrap(), CatchUp::Once);
        assert_eq!("2h".parse::<CatchUp>().unwrap(), CatchUp::Window(Dur::secs(7200)));
        assert!(matches!("sometimes".parse::<CatchUp>(), Err(JobError::CatchUp(_))));
        for c in [CatchUp::Skip, CatchUp::Once, CatchUp::Window(Dur::secs(5400))] {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<CatchUp>(&json).unwrap(), c, "{json}");
        }
        assert_eq!(serde_json::to_string(&CatchUp::Window(Dur::secs(5400))).unwrap(), r#""1h30m""#);
    }

    #[test]
    fn history_is_bounded_and_summaries_cut() {
        let mut st = JobState::default();
        let t = ts("2026-05-01T10:00:00Z");
        for i in 0..15 {
            st.push(RunRecord {
                scheduled: t,
                started: t,
                finished: t,
                status: if i == 14 { RunStatus::Error } else { RunStatus::Ok },
                summary: format!("{i}{}", "é".repeat(300)),
                model: None,
            });
        }
        assert_eq!(st.history.len(), HISTORY_LEN);
        assert!(st.history[0].summary.starts_with('5'));
        assert_eq!(st.history[9].summary.chars().count(), SUMMARY_LEN);
        assert!(st.history[9].summary.ends_with('…'));
        assert_eq!(st.last_status, Some(RunStatus::Error));
    }

    #[test]
    fn job_json_round_trips_with_targets_and_origin() {
        let now = ts("2026-05-01T10:00:00Z");
        let mut j = Job::new(
            "report",
            parse_cron("0 9 * * *", Some("Europe/Berlin")).unwrap(),
            JobKind::Message { text: "summarise the night".into() },
            vec!["telegram:42".parse().unwrap(), "mqtt".parse().unwrap()],
            now,
            &TimeZone::UTC,
        )
        .unwrap();
        j.origin = Some(Conversation::new(crate::bus::Channel::Telegram, "42", "telegram:42"));
        let json = serde_json::to_string(&j).unwrap();
        assert!(json.contains(r#""deliver":["telegram:42","mqtt"]"#), "{json}");
        assert!(json.contains(r#""kind":{"type":"message","text":"summarise the night"}"#), "{json}");
        assert!(json.contains(r#""catch_up":"skip""#), "{json}");
        assert_eq!(serde_json::from_str::<Job>(&json).unwrap(), j);
    }
}
