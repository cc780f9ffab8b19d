//! How `cron list`, `cron show` and `cron add` show a job: a table with a
//! header whose columns are as wide as their longest cell (a long name moves
//! the columns, never breaks them), times in the job's own zone, and the
//! same jobs as JSON with stable field names for scripts.
//!
//! The JSON is a contract (scripts parse it): fields are added, never renamed
//! or removed. `cron list --json` is an array of [`JobJson`]; `cron show
//! --json` is one with `runs`.

use std::io::Write;

use serde::Serialize;

use crate::config::{Loaded, TzName};
use crate::scheduler::{Job, JobKind, JobStore, Schedule};

/// How long a job that is done (a one-shot that ran, a job past `--max-runs`
/// or `--until`) is kept for `cron list --all` before it is removed.
pub(super) const KEEP_DONE: jiff::SignedDuration = jiff::SignedDuration::from_hours(30 * 24);

/// A one-line field of a job, its control characters escaped (it may have
/// come from outside: a chat, a command's output, a server's error).
pub(super) fn esc(text: &str) -> std::borrow::Cow<'_, str> {
    crate::util::text::escape_line(text)
}

/// A job's time as its schedule reads: a cron job's own zone, else the configured one.
pub(super) fn in_zone(t: Option<jiff::Timestamp>, schedule: &Schedule, tz: &TzName) -> String {
    crate::scheduler::schedule::local_time(t, &schedule.zone(tz.tz()))
}

/// A time for a table cell: `2026-11-27 07:00 CET`, in the job's zone.
fn short_time(t: Option<jiff::Timestamp>, schedule: &Schedule, tz: &TzName) -> String {
    match t {
        Some(t) => t.to_zoned(schedule.zone(tz.tz())).strftime("%Y-%m-%d %H:%M %Z").to_string(),
        None => "-".into(),
    }
}

/// `jitter`, `max runs` and `until` lines of a job, when set.
pub(super) fn limits(j: &Job, tz: &TzName) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = j.jitter {
        out.push(format!("jitter:   up to {w} (this job starts {} late)", crate::config::Dur(j.jitter_offset())));
    }
    if let Some(m) = j.max_runs {
        out.push(format!("runs:     {} of {m}", j.state.runs));
    }
    if let Some(u) = j.until {
        out.push(format!("until:    {}", in_zone(Some(u), &j.schedule, tz)));
    }
    out
}

pub(super) fn kind_name_of(j: &Job) -> &'static str {
    if j.watch.is_some() {
        "watch"
    } else {
        match j.kind {
            JobKind::Message { .. } => "message",
            JobKind::Remind { .. } => "remind",
            JobKind::Exec { .. } => "exec",
        }
    }
}

/// `cron list`: a header and one row per job; done jobs only with `all`.
/// Done jobs older than [`KEEP_DONE`] are removed first.
pub(super) fn list(
    loaded: &Loaded,
    store: &JobStore,
    all: bool,
    json: bool,
    now: jiff::Timestamp,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let tz = loaded.config.timezone();
    store.prune_done(now - KEEP_DONE)?;
    let jobs = store.list()?;
    let hidden = jobs.iter().filter(|j| j.state.done).count();
    let shown: Vec<&Job> = jobs.iter().filter(|j| all || !j.state.done).collect();
    // One buffered writer: thousands of jobs are thousands of lines.
    let mut out = std::io::BufWriter::new(out);
    if json {
        let rows: Vec<JobJson> = shown.iter().map(|j| JobJson::of(j, &tz, false)).collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        out.flush()?;
        return Ok(());
    }
    let corrupt = store.corrupt_notice();
    if let Some(notice) = &corrupt {
        writeln!(out, "job store: {notice}")?;
    }
    if jobs.is_empty() && corrupt.is_none() {
        writeln!(out, "no jobs. Add one: bramble cron add NAME --every 1h --remind \"stretch\"")?;
    }
    if !shown.is_empty() {
        let rows: Vec<[String; 6]> = shown.iter().map(|j| row(j, &tz)).collect();
        table(&mut out, &["ID", "NAME", "KIND", "SCHEDULE", "NEXT RUN", "LAST"], &rows)?;
    }
    if hidden > 0 && !all {
        let s = if hidden == 1 { "" } else { "s" };
        writeln!(out, "({hidden} done job{s} not shown: `bramble cron list --all`; kept 30 days)")?;
    }
    out.flush()?;
    Ok(())
}

/// One table row of a job.
fn row(j: &Job, tz: &TzName) -> [String; 6] {
    let next = if j.state.done {
        "done".to_string()
    } else if !j.enabled {
        "disabled".to_string()
    } else {
        short_time(j.state.next_run, &j.schedule, tz)
    };
    let last = j.state.last_status.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
    [j.id.clone(), esc(&j.name).into_owned(), kind_name_of(j).into(), j.schedule.summary(tz.tz()), next, last]
}

/// Columns as wide as their widest cell (in characters), two spaces apart;
/// the last column is not padded.
pub(super) fn table<const N: usize>(
    out: &mut dyn Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> std::io::Result<()> {
    let mut widths: [usize; N] = header.map(|h| h.chars().count());
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: &mut dyn Iterator<Item = &str>| -> std::io::Result<()> {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 < N {
                let pad = widths[i].saturating_sub(cell.chars().count());
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', pad + 2));
            } else {
                text.push_str(cell);
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(out, &mut header.iter().copied())?;
    for r in rows {
        line(out, &mut r.iter().map(String::as_str))?;
    }
    Ok(())
}

/// `cron show`: one job, its settings and its recent runs.
pub(super) fn show(loaded: &Loaded, j: &Job, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let tz = loaded.config.timezone();
    if json {
        serde_json::to_writer_pretty(&mut *out, &JobJson::of(j, &tz, true))?;
        writeln!(out)?;
        return Ok(());
    }
    // Every text a job holds may have come from outside (a chat, a
    // command's output, a server's error): shown with its controls escaped.
    writeln!(out, "{} ({})", esc(&j.name), j.id)?;
    writeln!(out, "  kind:      {}", kind_name_of(j))?;
    match &j.kind {
        JobKind::Message { text } | JobKind::Remind { text } => writeln!(out, "  text:      {}", esc(text))?,
        JobKind::Exec { command } => writeln!(out, "  command:   {}", esc(command))?,
    }
    writeln!(out, "  schedule:  {}", j.schedule.describe(tz.tz()))?;
    writeln!(out, "  catch-up:  {}", j.catch_up)?;
    if let Some(m) = &j.model {
        writeln!(out, "  model:     {}", crate::provider::chain::Chain::label_in(&loaded.config, m))?;
    }
    if let Some(w) = &j.watch {
        writeln!(out, "  watch:     {} (the turn runs when: {})", esc(&w.command), w.mode.as_str())?;
        if let Some(seen) = &j.state.watch {
            let first = seen.output.lines().next().unwrap_or("");
            writeln!(out, "  last seen: {}", esc(&crate::scheduler::job::truncate(first, 80)))?;
        }
    }
    for line in limits(j, &tz) {
        writeln!(out, "  {}", line.replacen(": ", ":  ", 1))?;
    }
    if j.ha_button {
        writeln!(out, "  HA button: yes (`{}`)", crate::channels::mqtt::discovery::button_object(&j.name))?;
    }
    let targets: Vec<String> = j.report_target_names();
    writeln!(out, "  deliver:   {}", esc(&targets.join(", ")))?;
    if !j.attach.is_empty() {
        writeln!(out, "  attach:    {}", esc(&j.attach.join(", ")))?;
    }
    writeln!(out, "  enabled:   {}{}", j.enabled, if j.state.done { " (done)" } else { "" })?;
    writeln!(out, "  next run:  {}", in_zone(j.state.next_run, &j.schedule, &tz))?;
    if let Some(e) = &j.state.last_error {
        writeln!(out, "  last error: {}", esc(e))?;
    }
    for r in &j.state.history {
        let by = r.model.as_deref().map(|m| format!("  [{}]", esc(m))).unwrap_or_default();
        // One line per run: a report's lines joined.
        let summary = r.summary.split_whitespace().collect::<Vec<_>>().join(" ");
        let summary = esc(&summary);
        writeln!(out, "  {}  {:<7}  {summary}{by}", in_zone(Some(r.started), &j.schedule, &tz), r.status.to_string())?;
    }
    Ok(())
}

/// A job as `cron list --json` and `cron show --json` print it. Times are
/// RFC 3339 in UTC (`…Z`); `zone` is the IANA zone the job's times are read
/// and shown in. Stable: fields are added, never renamed or removed.
#[derive(Debug, Serialize)]
pub(super) struct JobJson<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// `message`, `remind`, `exec` or `watch`.
    pub kind: &'static str,
    /// The task (`message`, `remind`, `watch`) or the command (`exec`).
    pub text: &'a str,
    /// As `jobs.json` stores it: `{"kind":"every","every":"10m","anchor":…}`,
    /// `{"kind":"cron","expr":…,"tz":…}`, `{"kind":"at","at":…}`.
    pub schedule: &'a Schedule,
    pub zone: String,
    pub enabled: bool,
    pub done: bool,
    pub next_run: Option<String>,
    pub last_run: Option<String>,
    /// `ok`, `error`, `skipped`, `missed`, `cancelled`, or null.
    pub last_status: Option<crate::scheduler::RunStatus>,
    pub last_error: Option<&'a str>,
    pub deliver: Vec<String>,
    /// `cron show --json` only: the recent runs, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<RunJson<'a>>>,
}

/// One run in [`JobJson::runs`].
#[derive(Debug, Serialize)]
pub(super) struct RunJson<'a> {
    pub started: String,
    pub finished: String,
    pub status: crate::scheduler::RunStatus,
    pub summary: &'a str,
    pub model: Option<&'a str>,
}

fn utc(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl<'a> JobJson<'a> {
    pub(super) fn of(j: &'a Job, tz: &TzName, runs: bool) -> JobJson<'a> {
        let text = match &j.kind {
            JobKind::Message { text } | JobKind::Remind { text } => text.as_str(),
            JobKind::Exec { command } => command.as_str(),
        };
        let zone = j.schedule.zone(tz.tz());
        JobJson {
            id: &j.id,
            name: &j.name,
            kind: kind_name_of(j),
            text,
            schedule: &j.schedule,
            zone: zone.iana_name().unwrap_or(tz.name()).to_string(),
            enabled: j.enabled,
            done: j.state.done,
            next_run: j.state.next_run.map(utc),
            last_run: j.state.last_run.map(utc),
            last_status: j.state.last_status,
            last_error: j.state.last_error.as_deref(),
            deliver: j.report_target_names(),
            runs: runs.then(|| {
                j.state
                    .history
                    .iter()
                    .map(|r| RunJson {
                        started: utc(r.started),
                        finished: utc(r.finished),
                        status: r.status,
                        summary: &r.summary,
                        model: r.model.as_deref(),
                    })
                    .collect()
            }),
        }
    }
}
