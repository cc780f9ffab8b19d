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
//!
//! A full disk (or any failed write) must not lose reports either. In the
//! daemon ([`Outbox::holding_in_memory`]) a report that cannot be written is
//! kept in memory — at most [`HELD_MAX_REPORTS`] reports and
//! [`HELD_MAX_BYTES`] bytes of text — and dispatched from there like any
//! other; every later write (the next report, a delivery outcome) and every
//! dispatcher wake-up with reports held tries to write them to the file
//! again. Beyond the bound a report is dropped with an ERROR line naming its
//! source and target. Held reports die with the process (a crash while the
//! disk is full loses them). CLI processes do not hold: they exit, so they
//! report the error instead.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::bus::Target;
use crate::util;

/// Delivered entries kept for `bramble status` (the newest ones).
const RECENT_KEPT: usize = 20;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// At most this many reports are held in memory while the outbox cannot be written.
pub const HELD_MAX_REPORTS: usize = 256;
/// At most this many bytes of report text (and source) are held in memory.
pub const HELD_MAX_BYTES: usize = 1024 * 1024;

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

/// The outbox in a state directory. Clones share the reports held in memory.
#[derive(Debug, Clone)]
pub struct Outbox {
    path: PathBuf,
    lock_path: PathBuf,
    /// Reports not yet on disk (the write failed); `None` outside the daemon.
    held: Option<Arc<Mutex<Held>>>,
    /// Tests: make every write fail with ENOSPC while set.
    #[cfg(test)]
    fail_writes: Arc<std::sync::atomic::AtomicBool>,
}

/// Reports waiting in memory for a successful write.
#[derive(Debug, Default)]
struct Held {
    entries: Vec<Entry>,
    bytes: usize,
    /// The highest id handed out to a held report.
    last_id: u64,
}

fn held_size(e: &Entry) -> usize {
    e.text.len() + e.source.len()
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
        Outbox {
            path: state_dir.join("outbox.json"),
            lock_path: state_dir.join("outbox.lock"),
            held: None,
            #[cfg(test)]
            fail_writes: Arc::default(),
        }
    }

    /// Keep reports in memory when the file cannot be written (the daemon),
    /// bounded by [`HELD_MAX_REPORTS`] and [`HELD_MAX_BYTES`].
    pub fn holding_in_memory(mut self) -> Outbox {
        self.held = Some(Arc::default());
        self
    }

    /// How many reports are held in memory, not yet written.
    pub fn held(&self) -> usize {
        self.held_lock().map_or(0, |h| h.entries.len())
    }

    fn held_lock(&self) -> Option<MutexGuard<'_, Held>> {
        self.held.as_ref().map(|h| h.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Try to write the held reports to the file (one write; nothing if none are held).
    pub fn flush(&self) -> Result<(), OutboxError> {
        if self.held() == 0 {
            return Ok(());
        }
        self.update(|_| ())
    }

    /// Keep `entry` in memory after `err` (a failed write), if this outbox
    /// holds and the bound allows; else log the drop and return `err`.
    fn hold(&self, err: OutboxError, mut entry: Entry) -> Result<u64, OutboxError> {
        if !matches!(err, OutboxError::Io { .. }) || self.held.is_none() {
            return Err(err);
        }
        // Above every id on disk (read before taking the memory lock: the
        // file lock is always taken first).
        let disk_next = self.read().map(|f| f.next_id).unwrap_or(0);
        let Some(mut h) = self.held_lock() else { return Err(err) };
        let size = held_size(&entry);
        if h.entries.len() >= HELD_MAX_REPORTS || h.bytes + size > HELD_MAX_BYTES {
            tracing::error!(
                source = %entry.source,
                target = %entry.target,
                "report dropped: the outbox cannot be written ({err}) and {} reports ({} bytes) are already held in memory",
                h.entries.len(),
                h.bytes
            );
            return Err(err);
        }
        entry.id = disk_next.max(h.last_id) + 1;
        h.last_id = entry.id;
        h.bytes += size;
        h.entries.push(entry);
        tracing::warn!(
            held = h.entries.len(),
            "the outbox cannot be written ({err}); the report is kept in memory and delivered from there; the write is retried"
        );
        Ok(h.last_id)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue a report. It is on disk when this returns.
    ///
    /// If the write fails, an outbox [holding in memory](Self::holding_in_memory)
    /// keeps the report there (within its bound) and returns its id.
    pub fn enqueue(&self, target: Target, text: &str, source: &str) -> Result<u64, OutboxError> {
        let entry = Entry {
            id: 0,
            target,
            text: text.to_string(),
            source: source.to_string(),
            created: Timestamp::now(),
            attempts: 0,
            next_attempt: None,
            last_error: None,
        };
        let written = self.update(|f| {
            f.next_id += 1;
            let id = f.next_id;
            f.pending.push(Entry { id, ..entry.clone() });
            id
        });
        written.or_else(|e| self.hold(e, entry))
    }

    /// The file's contents with the reports held in memory added.
    fn read_all(&self) -> Result<OutboxFile, OutboxError> {
        let mut f = self.read()?;
        if let Some(h) = self.held_lock() {
            f.pending.extend(h.entries.iter().cloned());
        }
        Ok(f)
    }

    /// Reports waiting for delivery, oldest first.
    pub fn pending(&self) -> Result<Vec<Entry>, OutboxError> {
        Ok(self.read_all()?.pending)
    }

    /// Recently delivered or dropped reports, newest last.
    pub fn recent(&self) -> Result<Vec<Delivered>, OutboxError> {
        Ok(self.read()?.recent.into())
    }

    /// Entries due for an attempt at `now`. With reports held in memory, this
    /// first tries to write them (the dispatcher's wake-ups are the retry timer).
    pub fn due(&self, now: Timestamp) -> Result<Vec<Entry>, OutboxError> {
        if let Err(e) = self.flush() {
            tracing::debug!("held reports still not written: {e}");
        }
        Ok(self.read_all()?.pending.into_iter().filter(|e| e.next_attempt.is_none_or(|t| t <= now)).collect())
    }

    /// The earliest time a pending entry may be tried, if any.
    pub fn next_due(&self) -> Result<Option<Timestamp>, OutboxError> {
        self.next_due_for(|_| true)
    }

    /// The earliest time a pending entry whose target passes `deliverable` may be tried.
    pub fn next_due_for(&self, deliverable: impl Fn(&Target) -> bool) -> Result<Option<Timestamp>, OutboxError> {
        Ok(self
            .read_all()?
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
        let mut in_memory = 0;
        if let Some(mut h) = self.held_lock() {
            for e in h.entries.iter_mut().filter(|e| waiting(e)) {
                e.next_attempt = None;
                in_memory += 1;
            }
        }
        if !self.read()?.pending.iter().any(waiting) {
            return Ok(in_memory);
        }
        self.update(|f| {
            let mut n = 0;
            for e in f.pending.iter_mut().filter(|e| waiting(e)) {
                e.next_attempt = None;
                n += 1;
            }
            n
        })
        .map(|n| n + in_memory)
    }

    /// Record the outcome of an attempt on entry `id`.
    pub fn record(&self, id: u64, attempt: Attempt, now: Timestamp) -> Result<(), OutboxError> {
        if let Some(mut h) = self.held_lock() {
            if let Some(pos) = h.entries.iter().position(|e| e.id == id) {
                // Never on disk: its outcome is kept in memory too.
                match attempt {
                    Attempt::Retry(err) => {
                        let e = &mut h.entries[pos];
                        e.attempts += 1;
                        e.next_attempt = now.checked_add(backoff(e.attempts)).ok();
                        e.last_error = Some(err);
                    }
                    Attempt::Delivered | Attempt::Drop(_) => {
                        let e = h.entries.remove(pos);
                        h.bytes = h.bytes.saturating_sub(held_size(&e));
                        if let Attempt::Drop(why) = attempt {
                            tracing::warn!(source = %e.source, target = %e.target, "report dropped: {why}");
                        }
                    }
                }
                return Ok(());
            }
        }
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
        // Reports held in memory go into the same write.
        let mut held = self.held_lock();
        let merged = held.as_deref().map_or(0, |h| merge(&mut file, &h.entries));
        let out = change(&mut file);
        file.version = 1;
        let data = serde_json::to_vec_pretty(&file).map_err(|e| self.io(std::io::Error::other(e)))?;
        self.write(&data)?;
        if let Some(h) = held.as_deref_mut().filter(|_| merged > 0) {
            h.entries.drain(..merged);
            h.bytes = h.entries.iter().map(held_size).sum();
            tracing::info!(
                reports = merged,
                "the outbox could be written again: the reports held in memory are on disk"
            );
        }
        Ok(out)
    }

    fn write(&self, data: &[u8]) -> Result<(), OutboxError> {
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.io(std::io::Error::from_raw_os_error(libc::ENOSPC)));
        }
        util::fs::write_atomic(&self.path, data).map_err(|e| self.io(e))
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
        let f = util::fs::open_lock_file(&self.lock_path).map_err(|e| self.io(e))?;
        f.lock().map_err(|e| self.io(e))?;
        Ok(f)
    }

    fn io(&self, source: std::io::Error) -> OutboxError {
        OutboxError::Io { path: self.path.clone(), source }
    }
}

/// Add held reports to `file` (a report whose id was taken meanwhile by
/// another process gets a new one). Returns how many.
fn merge(file: &mut OutboxFile, held: &[Entry]) -> usize {
    for e in held {
        let mut e = e.clone();
        let taken = |id: u64| file.pending.iter().any(|p| p.id == id) || file.recent.iter().any(|d| d.id == id);
        if taken(e.id) {
            e.id = file.next_id.max(e.id) + 1;
        }
        file.next_id = file.next_id.max(e.id);
        file.pending.push(e);
    }
    held.len()
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

    fn full(o: &Outbox, on: bool) {
        o.fail_writes.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    #[test]
    fn reports_are_held_in_memory_while_the_disk_is_full_then_written() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path()).holding_in_memory();
        let on_disk = o.enqueue(Target::Log, "before", "job:a").unwrap();
        full(&o, true);
        let a = o.enqueue(Target::Log, "one", "job:e1").unwrap();
        let b = o.clone().enqueue(Target::Mqtt(None), "two", "job:e2").unwrap();
        let c = o.enqueue(Target::Log, "three", "heartbeat").unwrap();
        assert!(a > on_disk && b > a && c > b, "fresh ids: {on_disk} {a} {b} {c}");
        assert_eq!(o.held(), 3);
        // Not on disk (a plain handle, like the CLI, sees only the file) ...
        assert_eq!(Outbox::new(dir.path()).pending().unwrap().len(), 1);
        // ... but dispatched from memory meanwhile; outcomes are kept there too.
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(o.due(now).unwrap().len(), 4);
        o.record(a, Attempt::Delivered, now).unwrap();
        o.record(b, Attempt::Retry("broker down".into()), now).unwrap();
        assert_eq!(o.held(), 2);
        assert_eq!(o.due(now).unwrap().iter().map(|e| e.id).collect::<Vec<_>>(), [on_disk, c]);
        // Space again: the dispatcher's next look writes them.
        full(&o, false);
        assert_eq!(o.due(now).unwrap().len(), 2);
        assert_eq!(o.held(), 0);
        let disk = Outbox::new(dir.path()).pending().unwrap();
        let texts: Vec<_> = disk.iter().map(|e| (e.id, e.text.as_str(), e.attempts)).collect();
        assert_eq!(texts, [(on_disk, "before", 0), (b, "two", 1), (c, "three", 0)]);
        // New reports get ids after the held ones.
        assert!(o.enqueue(Target::Log, "after", "agent").unwrap() > c);
    }

    #[test]
    fn the_next_successful_write_takes_the_held_reports_along() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path()).holding_in_memory();
        full(&o, true);
        o.enqueue(Target::Log, "held", "job:x").unwrap();
        full(&o, false);
        o.enqueue(Target::Log, "next", "job:y").unwrap();
        assert_eq!(o.held(), 0);
        let texts: Vec<_> = Outbox::new(dir.path()).pending().unwrap().into_iter().map(|e| e.text).collect();
        assert_eq!(texts, ["held", "next"]);
    }

    #[test]
    fn the_memory_is_bounded_and_a_plain_outbox_does_not_hold() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path()).holding_in_memory();
        full(&o, true);
        for i in 0..HELD_MAX_REPORTS {
            o.enqueue(Target::Log, &i.to_string(), "job:burst").unwrap();
        }
        let err = o.enqueue(Target::Log, "one too many", "job:burst").unwrap_err();
        assert!(err.to_string().contains("No space left on device"), "{err}");
        assert_eq!(o.held(), HELD_MAX_REPORTS);
        // The byte bound.
        let dir2 = tempfile::tempdir().unwrap();
        let big = Outbox::new(dir2.path()).holding_in_memory();
        full(&big, true);
        let text = "x".repeat(HELD_MAX_BYTES / 2);
        big.enqueue(Target::Log, &text, "a").unwrap();
        assert!(big.enqueue(Target::Log, &text, "b").is_err());
        // The CLI's outbox reports the error instead of holding.
        let plain = Outbox::new(dir.path());
        full(&plain, true);
        assert!(plain.enqueue(Target::Log, "x", "agent").is_err());
        assert_eq!(plain.held(), 0);
    }
}
