//! The heartbeat: every `[heartbeat] every`, look at `HEARTBEAT.md` and, if it
//! lists active tasks, run one agent turn on them.
//!
//! The rules (nanobot-compatible file, field complaints fixed):
//! - Only lines under a `## Active Tasks` heading count, and only those that
//!   are not blank, not headings, not HTML comments and not empty checkboxes.
//!   With none, the tick ends **without any LLM call** — a template or a
//!   comment-only file costs nothing.
//! - The agent decides with a tool call, `report(text)` or
//!   `nothing_to_report()` (offered in that turn only); a plain reply of
//!   `HEARTBEAT_OK` still means nothing to report. Nothing is delivered
//!   then (no "All clear." spam).
//! - Quiet hours skip the tick entirely.
//! - The interval is anchored on the last run, persisted in the state
//!   directory: a daemon restarted every 20 minutes still runs a 30-minute
//!   heartbeat (nanobot restarts the interval on each start and starves it).

use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::config::QuietHours;
use crate::util;
use crate::workspace::Workspace;

/// The reply that means "nothing to report".
pub const HEARTBEAT_OK: &str = "HEARTBEAT_OK";

/// The file, relative to the workspace.
pub const HEARTBEAT_FILE: &str = "HEARTBEAT.md";
/// Bytes of HEARTBEAT.md read at most: a task list, not a library.
const HEARTBEAT_READ_CAP: usize = 256 * 1024;

/// The text of `HEARTBEAT.md`, read the way bramble reads every workspace
/// file ([`Workspace::strict`]): a symlink, FIFO or device in its place is
/// refused (logged) and counts as no file; at most 256 KiB are read. Blocking.
pub fn read_file(workspace: &Path) -> Option<String> {
    match Workspace::strict(workspace).read_text(HEARTBEAT_FILE, HEARTBEAT_READ_CAP) {
        Ok(found) => found.map(|c| c.text),
        Err(e) => {
            tracing::warn!("{HEARTBEAT_FILE} ignored: {e}");
            None
        }
    }
}

/// The tasks listed under `## Active Tasks`.
pub fn active_tasks(markdown: &str) -> Vec<String> {
    let text = crate::util::text::strip_html_comments(markdown);
    let mut tasks = Vec::new();
    let mut in_section = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(heading) = t.strip_prefix("## ") {
            in_section = heading.trim().eq_ignore_ascii_case("active tasks");
            continue;
        }
        if t.starts_with("# ") || t == "#" || t == "##" {
            in_section = false;
            continue;
        }
        if !in_section || t.is_empty() || t.starts_with('#') {
            continue;
        }
        let bare = t.trim_start_matches(['-', '*', '+']).trim();
        if bare.is_empty() || bare == "[ ]" || bare == "[x]" {
            continue;
        }
        tasks.push(t.to_string());
    }
    tasks
}

/// What a heartbeat tick should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No HEARTBEAT.md, or no active tasks in it: nothing at all.
    NoTasks,
    /// Inside quiet hours.
    Quiet,
    /// Run one agent turn with these tasks.
    Run(Vec<String>),
}

/// Decide a tick from the file's content (None: no file) and the local time.
pub fn decide(file: Option<&str>, quiet: Option<QuietHours>, local: &jiff::Zoned) -> Decision {
    let tasks = file.map(active_tasks).unwrap_or_default();
    if tasks.is_empty() {
        return Decision::NoTasks;
    }
    let minute = u16::try_from(i32::from(local.hour()) * 60 + i32::from(local.minute())).unwrap_or(0);
    if quiet.is_some_and(|q| q.contains(minute)) {
        return Decision::Quiet;
    }
    Decision::Run(tasks)
}

/// The message of a heartbeat turn.
pub fn prompt(tasks: &[String], local: &jiff::Zoned) -> String {
    format!(
        "Heartbeat at {} ({}). These are the periodic tasks from HEARTBEAT.md:\n\n{}\n\n\
         Do them now with your tools. Then finish by calling `report` with only what the user needs to \
         know, or `nothing_to_report` if there is nothing worth reporting. (Without those tools: reply \
         with the report, or with exactly {HEARTBEAT_OK} and nothing else.)",
        local.strftime("%Y-%m-%d %H:%M"),
        local.time_zone().iana_name().unwrap_or("local time"),
        tasks.join("\n"),
    )
}

/// Whether a reply means "nothing to report". Tolerates punctuation and
/// markup around the token, as models add them.
pub fn is_ok_reply(reply: &str) -> bool {
    let t = reply.trim().trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
    t.eq_ignore_ascii_case(HEARTBEAT_OK)
}

/// The heartbeat's persisted state: when it last ran a turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatState {
    pub last_run: Option<Timestamp>,
    pub last_status: Option<String>,
}

/// `heartbeat.json` in the state directory.
#[derive(Debug, Clone)]
pub struct StateFile(PathBuf);

impl StateFile {
    pub fn new(state_dir: &Path) -> Self {
        StateFile(state_dir.join("heartbeat.json"))
    }
    /// The saved state; a missing or unreadable file is a fresh start (logged).
    pub fn load(&self) -> HeartbeatState {
        match std::fs::read(&self.0) {
            Ok(d) => serde_json::from_slice(&d).unwrap_or_else(|e| {
                tracing::warn!(file = %self.0.display(), error = %e, "heartbeat state unreadable; starting fresh");
                HeartbeatState::default()
            }),
            Err(_) => HeartbeatState::default(),
        }
    }
    pub fn save(&self, state: &HeartbeatState) -> std::io::Result<()> {
        let data = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        util::fs::write_atomic(&self.0, &data)
    }
}

/// When the next tick is due: one interval after the last run, or now if
/// that is already past (or it never ran).
pub fn next_due(last_run: Option<Timestamp>, every: std::time::Duration, now: Timestamp) -> Timestamp {
    let Some(last) = last_run else { return now };
    let Ok(span) = jiff::SignedDuration::try_from(every) else { return now };
    match last.checked_add(span) {
        Ok(next) if next > now => next,
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = include_str!("../../config/workspace/HEARTBEAT.md");

    #[test]
    fn the_shipped_template_has_no_tasks() {
        assert!(active_tasks(TEMPLATE).is_empty());
    }

    #[test]
    fn only_lines_under_active_tasks_count() {
        let md = "# Heartbeat\n\nintro line\n\n## Active Tasks\n\n- Check disk space\n<!-- - commented -->\n\
                  - [ ]\n\n### Evening\n* Water the plants\n\n## Done\n\n- old task\n";
        assert_eq!(active_tasks(md), ["- Check disk space", "* Water the plants"]);
    }

    #[test]
    fn multi_line_comments_and_blank_sections_have_no_tasks() {
        assert!(active_tasks("## Active Tasks\n<!--\n- a\n- b\n-->\n\n").is_empty());
        assert!(active_tasks("## Active Tasks\n").is_empty());
        assert!(active_tasks("").is_empty());
        assert!(active_tasks("- a task outside the section\n").is_empty());
    }

    #[test]
    fn decisions() {
        let tz = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        let night: jiff::Zoned = "2026-11-21T23:30:00+01:00[Europe/Berlin]".parse().unwrap();
        let day: jiff::Zoned = "2026-11-21T12:00:00+01:00[Europe/Berlin]".parse().unwrap();
        assert_eq!(day.time_zone(), &tz);
        let quiet: QuietHours = "23:00-07:00".parse().unwrap();
        let md = "## Active Tasks\n- check\n";
        assert_eq!(decide(None, Some(quiet), &day), Decision::NoTasks);
        assert_eq!(decide(Some(TEMPLATE), Some(quiet), &day), Decision::NoTasks);
        assert_eq!(decide(Some(md), Some(quiet), &night), Decision::Quiet);
        assert_eq!(decide(Some(md), Some(quiet), &day), Decision::Run(vec!["- check".into()]));
        assert_eq!(decide(Some(md), None, &night), Decision::Run(vec!["- check".into()]));
    }

    #[test]
    fn ok_replies() {
        for r in ["HEARTBEAT_OK", " heartbeat_ok.", "**HEARTBEAT_OK**", "`HEARTBEAT_OK`\n"] {
            assert!(is_ok_reply(r), "{r}");
        }
        for r in ["Disk is 95% full", "HEARTBEAT_OK but the disk is full", ""] {
            assert!(!is_ok_reply(r), "{r}");
        }
    }

    #[test]
    fn interval_survives_restarts() {
        let every = std::time::Duration::from_secs(1800);
        let t0: Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        // Restarted 20 minutes after the last run: due 10 minutes later, not 30.
        let now: Timestamp = "2026-01-01T10:20:00Z".parse().unwrap();
        assert_eq!(next_due(Some(t0), every, now), "2026-01-01T10:30:00Z".parse().unwrap());
        // Down for hours: due now (one run, not one per missed interval).
        let late: Timestamp = "2026-01-01T15:00:00Z".parse().unwrap();
        assert_eq!(next_due(Some(t0), every, late), late);
        assert_eq!(next_due(None, every, now), now);
    }

    #[test]
    fn state_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path());
        assert_eq!(f.load(), HeartbeatState::default());
        let s = HeartbeatState { last_run: Some(Timestamp::UNIX_EPOCH), last_status: Some("ok".into()) };
        f.save(&s).unwrap();
        assert_eq!(f.load(), s);
    }
}
