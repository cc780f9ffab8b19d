//! The outbox: every report goes through here and is kept on disk until a
//! channel has accepted it.
//!
//! Reminders that never arrive are one of the field's most common complaints,
//! so delivery is at-least-once: a report is written to `outbox.json` (atomic
//! replace) *before* delivery is attempted, and removed only after the channel
//! said yes. A channel that is down (broker restarting, no network) gets the
//! report again with exponential backoff (5 s … 10 min), across restarts too.
//! A permanent refusal (the chat does not exist) is logged and dropped.
//!
//! The file is shared with CLI processes (`bramble agent`, `bramble cron run`
//! can queue reports for the daemon to deliver): every change happens under an
//! advisory lock on `outbox.lock` and re-reads the file first. It is written
//! on enqueue and on each delivery outcome — never on a timer — so an idle
//! board does not wear out its SD card.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::bus::Target;
use crate::fsutil;

/// Delivered entries kept for `bramble status` (the newest ones).
const RECENT_KEPT: usize = 20;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// One report waiting for delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub id: u64,
    pub target: Target,
    pub text: String,
    /// What produced it: `job:<name>`, `heartbeat`, `agent`.
    pub source: String,
    pub created: Timestamp,
    pub attempts: u32,
    /// Not before this time (backoff); `None` = now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A delivered (or dropped) report, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    pub id: u64,
    pub target: Target,
    pub source: String,
    pub created: Timestamp,
    pub finished: Timestamp,
    /// `delivered` or `dropped: <reason>`.
    pub outcome: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct OutboxFile {
    version: u32,
    next_id: u64,
    pending: Vec<Entry>,
    #[serde(default)]
    recent: VecDeque<Delivered>,
}

/// Why the outbox could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("cannot use the outbox {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The file could not be parsed; it was moved aside, never deleted.
    #[error("the outbox {} was unreadable ({reason}); it was kept as {} and a new one started", path.display(), kept_as.display())]
    Corrupt { path: PathBuf, kept_as: PathBuf, reason: String },
}

/// The outbox in a state directory.
#[derive(Debug, Clone)]
pub struct Outbox {
    path: PathBuf,
    lock_path: PathBuf,
}

/// What happened to one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Try again later, with this error.
    Retry(String),
    /// Give up, with this reason.
    Drop(String),
}

impl Outbox {
    pub fn new(state_dir: &Path) -> Outbox {
        Outbox { path: state_dir.join("outbox.json"), lock_path: state_dir.join("outbox.lock") }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue a report. It is on disk when this returns.
    pub fn enqueue(&self, target: Target, text: &str, source: &str) -> Result<u64, OutboxError> {
        self.update(|f| {
            f.next_id += 1;
            let id = f.next_id;
            f.pending.push(Entry {
                id,
                target,
                text: text.to_string(),
                source: source.to_string(),
                created: Timestamp::now(),
                attempts: 0,
                next_attempt: None,
                last_error: None,
            });
            id
        })
    }

    /// Reports waiting for delivery, oldest first.
    pub fn pending(&self) -> Result<Vec<Entry>, OutboxError> {
        Ok(self.read()?.pending)
    }

    /// Recently delivered or dropped reports, newest last.
    pub fn recent(&self) -> Result<Vec<Delivered>, OutboxError> {
        Ok(self.read()?.recent.into())
    }

    /// Entries due for an attempt at `now`.
    pub fn due(&self, now: Timestamp) -> Result<Vec<Entry>, OutboxError> {
        Ok(self.read()?.pending.into_iter().filter(|e| e.next_attempt.is_none_or(|t| t <= now)).collect())
    }

    /// The earliest time a pending entry may be tried, if any.
    pub fn next_due(&self) -> Result<Option<Timestamp>, OutboxError> {
        self.next_due_for(|_| true)
    }

    /// The earliest time a pending entry whose target passes `deliverable` may be tried.
    pub fn next_due_for(&self, deliverable: impl Fn(&Target) -> bool) -> Result<Option<Timestamp>, OutboxError> {
        Ok(self
            .read()?
            .pending
            .iter()
            .filter(|e| deliverable(&e.target))
            .map(|e| e.next_attempt.unwrap_or(e.created))
            .min())
    }

    /// A channel is back (the MQTT broker reconnected): its reports waiting
    /// out a backoff become due now. Writes only if there are any. Returns how many.
    pub fn retry_now(&self, channel: &str) -> Result<usize, OutboxError> {
        let waiting = |e: &Entry| e.target.channel() == channel && e.next_attempt.is_some();
        if !self.read()?.pending.iter().any(waiting) {
            return Ok(0);
        }
        self.update(|f| {
            let mut n = 0;
            for e in f.pending.iter_mut().filter(|e| waiting(e)) {
                e.next_attempt = None;
                n += 1;
            }
            n
        })
    }

    /// Record the outcome of an attempt on entry `id`.
    pub fn record(&self, id: u64, attempt: Attempt, now: Timestamp) -> Result<(), OutboxError> {
        self.update(|f| {
            let Some(pos) = f.pending.iter().position(|e| e.id == id) else { return };
            let outcome = match attempt {
                Attempt::Retry(err) => {
                    let e = &mut f.pending[pos];
                    e.attempts += 1;
                    let backoff = backoff(e.attempts);
                    e.next_attempt = now.checked_add(backoff).ok();
                    e.last_error = Some(err);
                    return;
                }
                Attempt::Delivered => "delivered".to_string(),
                Attempt::Drop(why) => format!("dropped: {why}"),
            };
            let e = f.pending.remove(pos);
            f.recent.push_back(Delivered {
                id: e.id,
                target: e.target,
                source: e.source,
                created: e.created,
                finished: now,
                outcome,
            });
            while f.recent.len() > RECENT_KEPT {
                f.recent.pop_front();
            }
        })
    }

    /// Read-modify-write under the lock.
    fn update<T>(&self, change: impl FnOnce(&mut OutboxFile) -> T) -> Result<T, OutboxError> {
        let _lock = self.lock()?;
        let mut file = match self.read_unlocked() {
            Ok(f) => f,
            // Kept aside already; start a new file with this change rather than losing it.
            Err(e @ OutboxError::Corrupt { .. }) => {
                tracing::error!("{e}");
                OutboxFile::default()
            }
            Err(e) => return Err(e),
        };
        let out = change(&mut file);
        file.version = 1;
        let data = serde_json::to_vec_pretty(&file).map_err(|e| self.io(std::io::Error::other(e)))?;
        fsutil::write_atomic(&self.path, &data).map_err(|e| self.io(e))?;
        Ok(out)
    }

    fn read(&self) -> Result<OutboxFile, OutboxError> {
        let _lock = self.lock()?;
        self.read_unlocked()
    }

    fn read_unlocked(&self) -> Result<OutboxFile, OutboxError> {
        let data = match std::fs::read(&self.path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OutboxFile::default()),
            Err(e) => return Err(self.io(e)),
        };
        serde_json::from_slice(&data).or_else(|e| {
            let kept_as = self.path.with_extension(format!("json.corrupt-{}", Timestamp::now().as_second()));
            std::fs::rename(&self.path, &kept_as).map_err(|e| self.io(e))?;
            Err(OutboxError::Corrupt { path: self.path.clone(), kept_as, reason: e.to_string() })
        })
    }

    fn lock(&self) -> Result<File, OutboxError> {
        let f = fsutil::open_lock_file(&self.lock_path).map_err(|e| self.io(e))?;
        f.lock().map_err(|e| self.io(e))?;
        Ok(f)
    }

    fn io(&self, source: std::io::Error) -> OutboxError {
        OutboxError::Io { path: self.path.clone(), source }
    }
}

/// Delay before attempt `n + 1` after `n` failures: 5 s, 10 s, 20 s, … capped at 10 min.
pub fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn reports_survive_a_restart_until_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let a = Outbox::new(dir.path());
        let id = a.enqueue(Target::Telegram("42".into()), "wake up", "job:alarm").unwrap();
        // "Restart": a new handle on the same directory sees it.
        let b = Outbox::new(dir.path());
        let pending = b.pending().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].text, "wake up");
        b.record(id, Attempt::Delivered, ts("2026-01-01T00:00:00Z")).unwrap();
        assert!(a.pending().unwrap().is_empty());
        assert_eq!(a.recent().unwrap()[0].outcome, "delivered");
    }

    #[test]
    fn failures_back_off_and_are_not_due_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let id = o.enqueue(Target::Mqtt(None), "r", "heartbeat").unwrap();
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(o.due(now).unwrap().len(), 1);
        o.record(id, Attempt::Retry("broker down".into()), now).unwrap();
        assert!(o.due(now).unwrap().is_empty());
        assert_eq!(o.next_due().unwrap(), Some(ts("2026-01-01T00:00:05Z")));
        assert_eq!(o.due(ts("2026-01-01T00:00:05Z")).unwrap().len(), 1);
        o.record(id, Attempt::Retry("still down".into()), ts("2026-01-01T00:00:05Z")).unwrap();
        let e = &o.pending().unwrap()[0];
        assert_eq!(e.attempts, 2);
        assert_eq!(e.last_error.as_deref(), Some("still down"));
        assert_eq!(e.next_attempt, Some(ts("2026-01-01T00:00:15Z")));
    }

    #[test]
    fn a_channel_that_is_back_gets_its_reports_retried_now() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let now = ts("2026-01-01T00:00:00Z");
        let m = o.enqueue(Target::Mqtt(None), "r", "heartbeat").unwrap();
        let t = o.enqueue(Target::Telegram("1".into()), "t", "agent").unwrap();
        o.record(m, Attempt::Retry("broker down".into()), now).unwrap();
        o.record(t, Attempt::Retry("network".into()), now).unwrap();
        assert!(o.due(now).unwrap().is_empty());
        assert_eq!(o.retry_now("mqtt").unwrap(), 1);
        let due = o.due(now).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].id, due[0].attempts), (m, 1), "the attempt count is kept");
        assert_eq!(o.retry_now("mqtt").unwrap(), 0, "nothing left to hurry");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(5), Duration::from_secs(80));
        assert_eq!(backoff(50), MAX_BACKOFF);
    }

    #[test]
    fn dropped_reports_are_recorded_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let id = o.enqueue(Target::Telegram("1".into()), "x", "agent").unwrap();
        o.record(id, Attempt::Drop("chat not found".into()), Timestamp::now()).unwrap();
        assert!(o.pending().unwrap().is_empty());
        assert_eq!(o.recent().unwrap()[0].outcome, "dropped: chat not found");
    }

    #[test]
    fn a_corrupt_outbox_is_kept_aside_not_wiped() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        std::fs::write(o.path(), b"{ not json").unwrap();
        let err = o.pending().unwrap_err();
        let OutboxError::Corrupt { kept_as, .. } = err else { panic!("expected Corrupt, got {err}") };
        assert_eq!(std::fs::read(&kept_as).unwrap(), b"{ not json");
        // A fresh outbox starts after that.
        o.enqueue(Target::Log, "new", "agent").unwrap();
        assert_eq!(o.pending().unwrap().len(), 1);
    }

    #[test]
    fn a_report_queued_onto_a_corrupt_outbox_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        std::fs::write(o.path(), b"\x00garbage").unwrap();
        o.enqueue(Target::Log, "must survive", "job:x").unwrap();
        assert_eq!(o.pending().unwrap()[0].text, "must survive");
        let kept = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("outbox.json.corrupt-"));
        assert!(kept, "the corrupt file is kept aside");
    }

    #[test]
    fn recent_history_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        for i in 0..(RECENT_KEPT + 5) {
            let id = o.enqueue(Target::Log, &i.to_string(), "agent").unwrap();
            o.record(id, Attempt::Delivered, Timestamp::now()).unwrap();
        }
        assert_eq!(o.recent().unwrap().len(), RECENT_KEPT);
    }
}
