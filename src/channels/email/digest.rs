//! The daily digest (`email:<address>?digest=HH:MM`): a day's reports to
//! one address collected and sent as one mail at that local time.
//!
//! Durable, not in memory: delivering a report to a digest target appends
//! it to `<state>/email-digest/<target>.jsonl` (fsynced) and only then says
//! "delivered", so the outbox forgets it only once it is on disk. When the
//! digest is due — the first `HH:MM` after its oldest report — the file is
//! renamed to `.sending` (reports arriving meanwhile start a new file),
//! sent, and removed. A `.sending` file found at start (a crash, or SMTP
//! down at the time) is sent first, with backoff until it goes: nothing is
//! lost, and a digest is sent once unless the crash falls between the
//! server's acceptance and the removal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use serde::{Deserialize, Serialize};

use crate::bus::{EmailTarget, Target};

const DIR: &str = "email-digest";

/// One report waiting for its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub target: Target,
    /// Unix seconds when it was collected.
    pub at: i64,
    /// What produced it (`job:backup`).
    pub source: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
}

/// A digest due to be sent: its file and reports.
#[derive(Debug)]
pub struct Due {
    pub file: PathBuf,
    pub target: EmailTarget,
    pub entries: Vec<Entry>,
}

/// `<state>/email-digest/`.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn new(state_dir: &Path) -> Store {
        Store { dir: state_dir.join(DIR) }
    }

    /// Collect `entry` (durably). Blocking.
    pub fn add(&self, entry: &Entry) -> std::io::Result<()> {
        crate::util::fs::create_private_dir(&self.dir)?;
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        crate::util::fs::append_durable(&self.dir.join(file_name(&entry.target)), &line)
    }

    /// The digests due at `now` (moved to `.sending`, with those left from
    /// before), and when the next one is due. Blocking.
    pub fn due(&self, now: Timestamp, tz: &TimeZone) -> (Vec<Due>, Option<Timestamp>) {
        let (mut due, mut next) = (Vec::new(), None::<Timestamp>);
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return (due, next) };
        for path in dir.flatten().map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
            let sending = name.ends_with(".sending");
            if !sending && !name.ends_with(".jsonl") {
                continue;
            }
            let entries = read(&path);
            let Some(first) = entries.first() else {
                let _ = std::fs::remove_file(&path);
                continue;
            };
            let Target::Email(target @ EmailTarget { digest: Some(at), .. }) = &first.target else { continue };
            let when = next_at(first.at, *at, tz);
            if !sending && when > now {
                next = Some(next.map_or(when, |n| n.min(when)));
                continue;
            }
            let file = if sending { path.clone() } else { path.with_extension(format!("{}.sending", now.as_second())) };
            if !sending {
                if let Err(e) = std::fs::rename(&path, &file) {
                    tracing::error!(file = %path.display(), error = %e, "cannot set a digest aside for sending");
                    continue;
                }
            }
            due.push(Due { file, target: target.clone(), entries });
        }
        (due, next)
    }

    /// The digest was sent: forget it. Blocking.
    pub fn sent(&self, due: &Due) {
        if let Err(e) = std::fs::remove_file(&due.file) {
            tracing::error!(file = %due.file.display(), error = %e, "cannot remove a sent digest; it may be sent again");
        }
    }
}

/// The reports in `path`; a torn last line (a crash mid-append) is skipped.
fn read(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A file name for `target`: its address made safe, and its time.
fn file_name(target: &Target) -> String {
    let t = target.to_string();
    let safe: String =
        t.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
    format!("{safe}.jsonl")
}

/// The first `hour:minute` (local, in `tz`) after `since` (Unix seconds).
pub fn next_at(since: i64, (hour, minute): (i8, i8), tz: &TimeZone) -> Timestamp {
    let since = Timestamp::from_second(since).unwrap_or(Timestamp::UNIX_EPOCH);
    let local = since.to_zoned(tz.clone());
    let at = local.with().hour(hour).minute(minute).second(0).subsec_nanosecond(0).build();
    let Ok(mut at) = at else { return since };
    if at.timestamp() <= since {
        at = at.checked_add(1.day()).unwrap_or(at);
    }
    at.timestamp()
}

/// The digest's mail: a subject and the text, report after report.
pub fn compose(due: &Due, tz: &TimeZone) -> (String, String) {
    let n = due.entries.len();
    let subject = format!("bramble: daily digest ({n} report{})", if n == 1 { "" } else { "s" });
    let mut text = String::new();
    for e in &due.entries {
        let when = Timestamp::from_second(e.at).map(|t| t.to_zoned(tz.clone()).strftime("%a %H:%M").to_string());
        text.push_str(&format!("── {} · {}\n\n{}\n", e.source, when.unwrap_or_default(), e.text.trim_end()));
        if !e.attach.is_empty() {
            text.push_str(&format!("(files in the workspace: {})\n", e.attach.join(", ")));
        }
        text.push('\n');
    }
    (subject, text)
}

/// How long to sleep before looking again: until `next`, at most an hour.
pub fn wait_until(next: Option<Timestamp>, now: Timestamp) -> Duration {
    let max = Duration::from_secs(3600);
    match next {
        Some(n) => Duration::try_from(n.duration_since(now)).unwrap_or(Duration::ZERO).min(max),
        None => max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(target: &str, at: i64, text: &str) -> Entry {
        Entry {
            target: target.parse().unwrap(),
            at,
            source: "job:backup".into(),
            text: text.into(),
            attach: Vec::new(),
        }
    }

    #[test]
    fn a_digest_is_due_at_the_first_time_after_its_oldest_report() {
        let tz = TimeZone::UTC;
        // 2026-11-27 06:00 UTC: due at 07:00 the same day; at 07:30: the next day.
        let six = 1_795_240_800;
        assert_eq!(next_at(six, (7, 0), &tz).as_second(), six + 3600);
        assert_eq!(next_at(six + 5400, (7, 0), &tz).as_second(), six + 3600 + 86400);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        store.add(&entry("email:me@example.org?digest=07:00", six, "one")).unwrap();
        store.add(&entry("email:me@example.org?digest=07:00", six + 60, "two")).unwrap();
        let (due, next) = store.due(Timestamp::from_second(six + 120).unwrap(), &tz);
        assert!(due.is_empty());
        assert_eq!(next.unwrap().as_second(), six + 3600);
        let (due, _) = store.due(Timestamp::from_second(six + 3600).unwrap(), &tz);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].entries.len(), 2);
        let (subject, text) = compose(&due[0], &tz);
        assert!(subject.contains("2 reports") && text.contains("one") && text.contains("two"), "{text}");
        // Not sent (SMTP down): still there after a restart, and sent first.
        let (again, _) = Store::new(dir.path()).due(Timestamp::from_second(six + 3700).unwrap(), &tz);
        assert_eq!(again.len(), 1);
        store.sent(&again[0]);
        assert!(store.due(Timestamp::from_second(six + 99_999).unwrap(), &tz).0.is_empty());
    }
}
