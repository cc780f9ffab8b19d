//! The outbox: every report goes through here and is kept on disk until a
//! channel has accepted it.
//!
//! Reminders that never arrive are one of the field's most common complaints,
//! so delivery is at-least-once: a report is appended to `outbox.jsonl` and
//! flushed (`fdatasync`) *before* delivery is attempted, and marked done only
//! after the channel said yes. A channel that is down (broker restarting, no
//! network) gets the report again with exponential backoff (5 s … 10 min),
//! across restarts too. A permanent refusal (the chat does not exist) is
//! logged and dropped. A report the other side keeps refusing — an MQTT broker
//! closes the connection on a packet it will not take, so it looks like an
//! outage that a reconnect ends — is set aside after [`MAX_REFUSALS`] such
//! attempts (counted in the journal, so a restart does not reset the count),
//! and the dispatcher tries it after the others in each pass, so it never
//! holds them up. A report to an MQTT topic against MQTT's rules is not
//! queued at all.
//!
//! The file is a journal: one line per change (`add`, `set` for a new attempt
//! count or backoff, `done` with the outcome), never a rewrite of the whole
//! outbox per report. Reports queued together go out in one append and one
//! flush. Outcomes are appended without a flush of their own: the next
//! report's flush carries them, and a power cut before that can only make a
//! report be delivered twice, never lost. When the journal holds many more
//! lines than live entries it is compacted (atomic replace). The daemon keeps
//! the folded state in memory and reads only what other processes appended.
//! An `outbox.json` of an earlier version is converted on first use.
//!
//! The file is shared with CLI processes (`bramble agent`, `bramble cron run`
//! can queue reports for the daemon to deliver): every change happens under an
//! advisory lock on `outbox.lock` after reading what was appended since. It is
//! written on enqueue and on each delivery outcome — never on a timer — so an
//! idle board does not wear out its SD card. These calls wait on the disk: the
//! daemon makes them on a blocking thread.
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
//! report the error instead. A failed append is cut back off the file, so a
//! full disk never leaves half a line in the middle of the journal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::bus::{ReportSource, Target};
use crate::util;

/// Delivered entries kept for `bramble status` (the newest ones).
const RECENT_KEPT: usize = 20;
/// The journal is compacted when it has this many lines more than live
/// entries (≈ 250 KB; one atomic replace per ~500 reports).
#[cfg(not(test))]
const COMPACT_SLACK: usize = 1000;
#[cfg(test)]
const COMPACT_SLACK: usize = 100;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// A report the other side refused (or closed the connection on) this many
/// times is set aside: recorded as done with the reason, not retried.
pub const MAX_REFUSALS: u32 = 5;
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
    /// What produced it: `job:<name>`, `heartbeat`, `agent`, … (its stored string).
    pub source: ReportSource,
    pub created: Timestamp,
    pub attempts: u32,
    /// Not before this time (backoff); `None` = now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Attempts the other side refused or closed the connection on (see
    /// [`MAX_REFUSALS`]); on disk, so a restart does not start the count again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refusals: u32,
    /// The job whose report it is (for report buttons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<super::JobRef>,
    /// Workspace files sent with the text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
}

/// A delivered (or dropped) report, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    pub id: u64,
    pub target: Target,
    pub source: ReportSource,
    pub created: Timestamp,
    pub finished: Timestamp,
    /// `delivered` or `dropped: <reason>`.
    pub outcome: String,
}

/// The outbox's state: what the journal folds to (and what `outbox.json`
/// of earlier versions held).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct OutboxFile {
    #[serde(default)]
    version: u32,
    next_id: u64,
    pending: Vec<Entry>,
    #[serde(default)]
    recent: VecDeque<Delivered>,
}

/// One line of the journal.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    /// The first line of a compacted journal: ids handed out so far.
    Start { next_id: u64 },
    /// A report queued.
    Add(Entry),
    /// A report's attempt count, backoff or last error changed.
    Set(Entry),
    /// A report delivered or dropped.
    Done(Delivered),
}

impl OutboxFile {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Start { next_id } => self.next_id = self.next_id.max(*next_id),
            Op::Add(e) => {
                self.next_id = self.next_id.max(e.id);
                if !self.pending.iter().any(|p| p.id == e.id) {
                    self.pending.push(e.clone());
                }
            }
            Op::Set(e) => {
                if let Some(p) = self.pending.iter_mut().find(|p| p.id == e.id) {
                    *p = e.clone();
                }
            }
            Op::Done(d) => {
                self.next_id = self.next_id.max(d.id);
                self.pending.retain(|p| p.id != d.id);
                self.recent.push_back(d.clone());
                while self.recent.len() > RECENT_KEPT {
                    self.recent.pop_front();
                }
            }
        }
    }

    /// The journal that folds to this state.
    fn compacted(&self) -> Vec<Op> {
        let mut ops = vec![Op::Start { next_id: self.next_id }];
        ops.extend(self.recent.iter().cloned().map(Op::Done));
        ops.extend(self.pending.iter().cloned().map(Op::Add));
        ops
    }
}

/// The journal as last read by this process.
#[derive(Debug, Default)]
struct Cache {
    /// Device and inode of the file read; another means it was replaced (compacted).
    file: Option<(u64, u64)>,
    /// Bytes folded so far (up to the last complete line).
    len: u64,
    state: OutboxFile,
    /// Lines folded (for compaction).
    lines: usize,
    /// Lines that could not be read.
    unreadable: usize,
    /// The file ends in half a line (a power cut mid-append).
    torn: bool,
}

/// Why the outbox could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("cannot use the outbox {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A report to a target nothing can deliver to.
    #[error("a report to `{}` was not queued: {reason}", target.escape_debug())]
    Target { target: String, reason: String },
    /// The file could not be parsed; it was moved aside, never deleted.
    #[error("the outbox {} was unreadable ({reason}); it was kept as {} and a new one started", path.display(), kept_as.display())]
    Corrupt { path: PathBuf, kept_as: PathBuf, reason: String },
}

/// The outbox in a state directory. Clones share the reports held in memory
/// and the journal's folded state.
#[derive(Debug, Clone)]
pub struct Outbox {
    path: PathBuf,
    /// `outbox.json` of earlier versions.
    legacy_path: PathBuf,
    lock_path: PathBuf,
    cache: Arc<Mutex<Cache>>,
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

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn held_size(e: &Entry) -> usize {
    e.text.len() + e.source.stored_len()
}

/// What happened to one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Try again later, with this error.
    Retry(String),
    /// Refused by the other side, or the connection closed under it: try
    /// again later, but at most [`MAX_REFUSALS`] times in all.
    Suspect(String),
    /// Give up, with this reason.
    Drop(String),
}

impl Outbox {
    pub fn new(state_dir: &Path) -> Outbox {
        Outbox {
            path: state_dir.join("outbox.jsonl"),
            legacy_path: state_dir.join("outbox.json"),
            lock_path: state_dir.join("outbox.lock"),
            cache: Arc::default(),
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
        self.update(true, |_| (Vec::new(), ()))
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
    pub fn enqueue(&self, target: Target, text: &str, source: impl Into<ReportSource>) -> Result<u64, OutboxError> {
        let mut ids = self.enqueue_many(vec![super::Outgoing::new(target, text, source)]);
        ids.pop().unwrap_or_else(|| Err(self.io(std::io::Error::other("nothing queued"))))
    }

    /// Queue reports with one append and one flush; one result per report,
    /// in order (each held or dropped on its own if the write fails). A
    /// report to an MQTT topic against MQTT's rules is refused, not queued:
    /// a broker closes the connection on such a publish.
    pub fn enqueue_many(&self, reports: Vec<super::Outgoing>) -> Vec<Result<u64, OutboxError>> {
        let (reports, refused): (Vec<_>, Vec<_>) =
            reports.into_iter().enumerate().partition(|(_, o)| match &o.target {
                Target::Mqtt(Some(topic)) => util::mqtt::check_topic(topic).is_ok(),
                _ => true,
            });
        let mut results: Vec<(usize, Result<u64, OutboxError>)> = refused
            .into_iter()
            .map(|(i, o)| {
                let reason = match &o.target {
                    Target::Mqtt(Some(topic)) => util::mqtt::check_topic(topic).err().map(|e| e.to_string()),
                    _ => None,
                };
                (i, Err(OutboxError::Target { target: o.target.to_string(), reason: reason.unwrap_or_default() }))
            })
            .collect();
        let (order, reports): (Vec<usize>, Vec<_>) = reports.into_iter().unzip();
        results.extend(order.into_iter().zip(self.enqueue_checked(reports)));
        results.sort_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, r)| r).collect()
    }

    fn enqueue_checked(&self, reports: Vec<super::Outgoing>) -> Vec<Result<u64, OutboxError>> {
        let now = Timestamp::now();
        let entries: Vec<Entry> = reports
            .into_iter()
            .map(|o| Entry {
                id: 0,
                target: o.target,
                text: o.text,
                source: o.source,
                created: now,
                attempts: 0,
                next_attempt: None,
                last_error: None,
                refusals: 0,
                job: o.job,
                attach: o.attach,
            })
            .collect();
        if entries.is_empty() {
            return Vec::new();
        }
        let written = self.update(true, |f| {
            let ops: Vec<Op> =
                entries.iter().zip(1..).map(|(e, n)| Op::Add(Entry { id: f.next_id + n, ..e.clone() })).collect();
            let ids = ops.iter().map(|op| if let Op::Add(e) = op { e.id } else { 0 }).collect::<Vec<_>>();
            (ops, ids)
        });
        match written {
            Ok(ids) => ids.into_iter().map(Ok).collect(),
            Err(e) => {
                let reason = e.to_string();
                let mut first = Some(e);
                entries
                    .into_iter()
                    .map(|entry| {
                        let err = first.take().unwrap_or_else(|| self.io(std::io::Error::other(reason.clone())));
                        self.hold(err, entry)
                    })
                    .collect()
            }
        }
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

    /// Whether reports may be waiting, known without the lock or a read:
    /// `false` only when none were waiting at this process's last read, none
    /// are held in memory, and the journal is the same file of the same
    /// length (one `stat`). The dead-man asks every few minutes on the
    /// runtime thread; only a `true` sends it to a blocking thread to read.
    pub fn maybe_pending(&self) -> bool {
        if self.held() > 0 {
            return true;
        }
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if !cache.state.pending.is_empty() {
            return true;
        }
        match (std::fs::metadata(&self.path), cache.file) {
            (Ok(m), Some(id)) => (m.dev(), m.ino()) != id || m.len() != cache.len,
            (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => self.legacy_path.exists(),
            _ => true,
        }
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
        self.update(false, |f| {
            let ops: Vec<Op> = f
                .pending
                .iter()
                .filter(|e| waiting(e))
                .map(|e| Op::Set(Entry { next_attempt: None, ..e.clone() }))
                .collect();
            let n = ops.len();
            (ops, n)
        })
        .map(|n| n + in_memory)
    }

    /// `bramble outbox retry`: the waiting reports `which` picks become due
    /// now, their back-off cleared (a running daemon sees the change and
    /// tries them at its next pass). Writes only if there are any. Returns them.
    pub fn retry_where(&self, which: impl Fn(&Entry) -> bool) -> Result<Vec<Entry>, OutboxError> {
        if !self.read()?.pending.iter().any(&which) {
            return Ok(Vec::new());
        }
        self.update(true, |f| {
            let picked: Vec<Entry> = f.pending.iter().filter(|e| which(e)).cloned().collect();
            let ops = picked.iter().map(|e| Op::Set(Entry { next_attempt: None, ..e.clone() })).collect();
            (ops, picked)
        })
    }

    /// `bramble outbox drop`, and the reports of a job that was removed: the
    /// waiting reports `which` picks are recorded as `dropped: <reason>`
    /// (`bramble status` lists them among the recent) and never delivered.
    /// Writes only if there are any. Returns them.
    pub fn drop_where(
        &self,
        which: impl Fn(&Entry) -> bool,
        reason: &str,
        now: Timestamp,
    ) -> Result<Vec<Entry>, OutboxError> {
        if !self.read()?.pending.iter().any(&which) {
            return Ok(Vec::new());
        }
        self.update(true, |f| {
            let picked: Vec<Entry> = f.pending.iter().filter(|e| which(e)).cloned().collect();
            let ops = picked
                .iter()
                .filter_map(|e| settle(e, Attempt::Drop(reason.to_string()), now).err())
                .map(Op::Done)
                .collect();
            (ops, picked)
        })
    }

    /// Record the outcome of an attempt on entry `id`.
    pub fn record(&self, id: u64, attempt: Attempt, now: Timestamp) -> Result<(), OutboxError> {
        self.record_many(vec![(id, attempt)], now)
    }

    /// Record the outcomes of several attempts with one append (not flushed:
    /// see the module docs).
    pub fn record_many(&self, outcomes: Vec<(u64, Attempt)>, now: Timestamp) -> Result<(), OutboxError> {
        let mut on_disk = Vec::new();
        {
            let mut held = self.held_lock();
            for (id, attempt) in outcomes {
                let Some(h) = held.as_deref_mut() else {
                    on_disk.push((id, attempt));
                    continue;
                };
                let Some(pos) = h.entries.iter().position(|e| e.id == id) else {
                    on_disk.push((id, attempt));
                    continue;
                };
                // Never on disk: its outcome is kept in memory too.
                match settle(&h.entries[pos], attempt, now) {
                    Ok(next) => h.entries[pos] = next,
                    Err(done) => {
                        let e = h.entries.remove(pos);
                        h.bytes = h.bytes.saturating_sub(held_size(&e));
                        if done.outcome != "delivered" {
                            tracing::warn!(source = %e.source, target = %e.target, "report {}", done.outcome);
                        }
                    }
                }
            }
        }
        if on_disk.is_empty() {
            return Ok(());
        }
        self.update(false, |f| {
            let ops = on_disk
                .into_iter()
                .filter_map(|(id, attempt)| {
                    let e = f.pending.iter().find(|e| e.id == id)?;
                    Some(match settle(e, attempt, now) {
                        Ok(next) => Op::Set(next),
                        Err(done) => Op::Done(done),
                    })
                })
                .collect();
            (ops, ())
        })
    }

    /// Read what was appended since, then append `change`'s lines (and the
    /// reports held in memory) in one write, flushed if `sync`; all under the lock.
    fn update<T>(&self, sync: bool, change: impl FnOnce(&OutboxFile) -> (Vec<Op>, T)) -> Result<T, OutboxError> {
        let _lock = self.lock()?;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        match self.load(&mut cache) {
            Ok(()) => {}
            // Kept aside already; go on with a new journal rather than losing this change.
            Err(e @ OutboxError::Corrupt { .. }) => tracing::error!("{e}"),
            Err(e) => return Err(e),
        }
        let mut next = cache.state.clone();
        // Reports held in memory go into the same write.
        let mut held = self.held_lock();
        let mut ops = held.as_deref().map_or_else(Vec::new, |h| merge(&mut next, &h.entries));
        let merged = ops.len();
        let (changes, out) = change(&next);
        ops.extend(changes);
        if ops.is_empty() {
            return Ok(out);
        }
        for op in &ops {
            next.apply(op);
        }
        self.append(&mut cache, &ops, sync)?;
        cache.state = next;
        if let Some(h) = held.as_deref_mut().filter(|_| merged > 0) {
            h.entries.drain(..merged);
            h.bytes = h.entries.iter().map(held_size).sum();
            tracing::info!(
                reports = merged,
                "the outbox could be written again: the reports held in memory are on disk"
            );
        }
        drop(held);
        if cache.lines > cache.state.pending.len() + cache.state.recent.len() + COMPACT_SLACK {
            if let Err(e) = self.compact(&mut cache) {
                tracing::warn!("cannot compact the outbox (it keeps growing until it can): {e}");
            }
        }
        Ok(out)
    }

    /// Append `ops` as lines; on failure, cut the file back to where it was.
    fn append(&self, cache: &mut Cache, ops: &[Op], sync: bool) -> Result<(), OutboxError> {
        let mut buf = Vec::with_capacity(256 * ops.len());
        if cache.torn {
            // End the torn line, so ours stay whole.
            buf.push(b'\n');
        }
        for op in ops {
            serde_json::to_writer(&mut buf, op).map_err(|e| self.io(std::io::Error::other(e)))?;
            buf.push(b'\n');
        }
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.io(std::io::Error::from_raw_os_error(libc::ENOSPC)));
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(util::fs::FILE_MODE)
            .open(&self.path)
            .map_err(|e| self.io(e))?;
        let meta = file.metadata().map_err(|e| self.io(e))?;
        let before = meta.len();
        let written = (&file).write_all(&buf).and_then(|()| if sync { file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            let _ = file.set_len(before);
            return Err(self.io(e));
        }
        if cache.file.is_none() {
            // A new journal: its name must survive a power cut too.
            if let Some(dir) = self.path.parent() {
                util::fs::sync_dir(dir).map_err(|e| self.io(e))?;
            }
        }
        cache.file = Some((meta.dev(), meta.ino()));
        cache.len = before + buf.len() as u64;
        cache.lines += ops.len();
        cache.torn = false;
        Ok(())
    }

    /// Replace the journal by the lines its state folds to. A journal with
    /// unreadable lines is kept aside first.
    fn compact(&self, cache: &mut Cache) -> Result<(), OutboxError> {
        if cache.unreadable > 0 {
            let kept_as = self.path.with_extension(format!("jsonl.corrupt-{}", Timestamp::now().as_second()));
            std::fs::copy(&self.path, &kept_as).map_err(|e| self.io(e))?;
            tracing::warn!(kept_as = %kept_as.display(), lines = cache.unreadable, "the outbox had unreadable lines; a copy is kept");
        }
        let ops = cache.state.compacted();
        let mut buf = Vec::with_capacity(256 * ops.len());
        for op in &ops {
            serde_json::to_writer(&mut buf, op).map_err(|e| self.io(std::io::Error::other(e)))?;
            buf.push(b'\n');
        }
        util::fs::write_atomic(&self.path, &buf).map_err(|e| self.io(e))?;
        let meta = std::fs::metadata(&self.path).map_err(|e| self.io(e))?;
        *cache = Cache {
            file: Some((meta.dev(), meta.ino())),
            len: buf.len() as u64,
            state: std::mem::take(&mut cache.state),
            lines: ops.len(),
            unreadable: 0,
            torn: false,
        };
        Ok(())
    }

    /// The current state (with what other processes appended), under the lock.
    fn read(&self) -> Result<OutboxFile, OutboxError> {
        let _lock = self.lock()?;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        self.load(&mut cache)?;
        Ok(cache.state.clone())
    }

    /// Bring `cache` up to date with the journal (the lock is held).
    fn load(&self, cache: &mut Cache) -> Result<(), OutboxError> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *cache = Cache::default();
                return self.convert_legacy(cache);
            }
            Err(e) => return Err(self.io(e)),
        };
        let meta = file.metadata().map_err(|e| self.io(e))?;
        let id = (meta.dev(), meta.ino());
        if cache.file != Some(id) || meta.len() < cache.len {
            // Compacted (or cut back) by another process: read it all.
            *cache = Cache { file: Some(id), ..Cache::default() };
        }
        if meta.len() == cache.len {
            return Ok(());
        }
        let mut new = vec![0; (meta.len() - cache.len) as usize];
        file.read_exact_at(&mut new, cache.len).map_err(|e| self.io(e))?;
        let complete = new.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in new[..complete].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Op>(line) {
                Ok(op) => {
                    cache.state.apply(&op);
                    cache.lines += 1;
                }
                Err(e) => {
                    cache.unreadable += 1;
                    tracing::warn!(file = %self.path.display(), "an unreadable line in the outbox was skipped: {e}");
                }
            }
        }
        cache.len += complete as u64;
        cache.torn = complete < new.len();
        Ok(())
    }

    /// Start the journal from an `outbox.json` of an earlier version, if there
    /// is one (an unreadable one is kept aside, as before).
    fn convert_legacy(&self, cache: &mut Cache) -> Result<(), OutboxError> {
        let data = match std::fs::read(&self.legacy_path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io(e)),
        };
        match serde_json::from_slice::<OutboxFile>(&data) {
            Ok(old) => {
                cache.state = old;
                self.compact(cache)?;
                std::fs::remove_file(&self.legacy_path).map_err(|e| self.io(e))?;
                tracing::info!(file = %self.path.display(), "the outbox was converted to a journal");
                Ok(())
            }
            Err(e) => {
                let kept_as = self.legacy_path.with_extension(format!("json.corrupt-{}", Timestamp::now().as_second()));
                std::fs::rename(&self.legacy_path, &kept_as).map_err(|e| self.io(e))?;
                Err(OutboxError::Corrupt { path: self.legacy_path.clone(), kept_as, reason: e.to_string() })
            }
        }
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

/// `Add` lines for the held reports (a report whose id was taken meanwhile
/// by another process gets a new one), applied to `file` as well.
fn merge(file: &mut OutboxFile, held: &[Entry]) -> Vec<Op> {
    let mut ops = Vec::with_capacity(held.len());
    for e in held {
        let mut e = e.clone();
        let taken = |id: u64| file.pending.iter().any(|p| p.id == id) || file.recent.iter().any(|d| d.id == id);
        if taken(e.id) {
            e.id = file.next_id.max(e.id) + 1;
        }
        let op = Op::Add(e);
        file.apply(&op);
        ops.push(op);
    }
    ops
}

/// What an attempt makes of an entry: the entry to try again (`Ok`), or the
/// record of it done — delivered, dropped, or set aside after its
/// [`MAX_REFUSALS`]th refusal (`Err`).
#[allow(clippy::result_large_err)] // Both sides are records of the same size; not an error path.
fn settle(e: &Entry, attempt: Attempt, now: Timestamp) -> Result<Entry, Delivered> {
    let done = |outcome: String| Delivered {
        id: e.id,
        target: e.target.clone(),
        source: e.source.clone(),
        created: e.created,
        finished: now,
        outcome,
    };
    let (err, refusals) = match attempt {
        Attempt::Delivered => return Err(done("delivered".into())),
        Attempt::Drop(why) => return Err(done(format!("dropped: {why}"))),
        Attempt::Retry(err) => (err, e.refusals),
        Attempt::Suspect(err) => (err, e.refusals + 1),
    };
    if refusals >= MAX_REFUSALS {
        tracing::error!(
            source = %e.source,
            target = %e.target,
            "report set aside after {refusals} refusals, not retried again: {err}"
        );
        return Err(done(format!("set aside after {refusals} refusals: {err}")));
    }
    let attempts = e.attempts + 1;
    Ok(Entry {
        attempts,
        refusals,
        next_attempt: now.checked_add(backoff(attempts)).ok(),
        last_error: Some(err),
        ..e.clone()
    })
}

/// The earliest time one of `entries` whose target passes `deliverable` may be tried.
pub fn next_attempt_at(entries: &[Entry], deliverable: impl Fn(&Target) -> bool) -> Option<Timestamp> {
    entries.iter().filter(|e| deliverable(&e.target)).map(|e| e.next_attempt.unwrap_or(e.created)).min()
}

/// Delay before attempt `n + 1` after `n` failures: 5 s, 10 s, 20 s, … capped at 10 min.
pub fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
    fn maybe_pending_is_false_only_when_surely_nothing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Outbox::new(dir.path());
        assert!(!daemon.maybe_pending(), "no outbox yet");
        let id = daemon.enqueue(Target::Mqtt(None), "r", "heartbeat").unwrap();
        assert!(daemon.maybe_pending(), "one waits");
        daemon.record(id, Attempt::Delivered, ts("2026-01-01T00:00:00Z")).unwrap();
        assert!(!daemon.maybe_pending(), "delivered, and this process wrote the last line");
        // Another process (`bramble cron run`) queues one: the file grew.
        Outbox::new(dir.path()).enqueue(Target::Mqtt(None), "from the CLI", "cli").unwrap();
        assert!(daemon.maybe_pending(), "the journal changed since the last read");
        assert_eq!(daemon.pending().unwrap().len(), 1);
        assert!(daemon.maybe_pending());
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
        assert_eq!(next_attempt_at(&o.pending().unwrap(), |_| true), Some(ts("2026-01-01T00:00:05Z")));
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
    fn a_report_refused_again_and_again_is_set_aside_and_the_count_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let bad = o.enqueue(Target::Mqtt(None), "big", "job:x").unwrap();
        let now = ts("2026-01-01T00:00:00Z");
        o.record(bad, Attempt::Retry("not connected".into()), now).unwrap();
        for _ in 1..MAX_REFUSALS {
            // A new handle each time: a restart does not reset the count.
            Outbox::new(dir.path()).record(bad, Attempt::Suspect("connection lost".into()), now).unwrap();
        }
        let e = &o.pending().unwrap()[0];
        assert_eq!((e.refusals, e.attempts), (MAX_REFUSALS - 1, MAX_REFUSALS));
        o.record(bad, Attempt::Suspect("connection lost".into()), now).unwrap();
        assert!(o.pending().unwrap().is_empty(), "set aside, not retried");
        let outcome = &o.recent().unwrap()[0].outcome;
        assert_eq!(outcome, &format!("set aside after {MAX_REFUSALS} refusals: connection lost"));
    }

    #[test]
    fn a_report_to_a_topic_against_mqtt_rules_is_not_queued() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let results = o.enqueue_many(vec![
            super::super::Outgoing::new(Target::Log, "a", "agent"),
            super::super::Outgoing::new(Target::Mqtt(Some("a/\0".into())), "b", "agent"),
            super::super::Outgoing::new(Target::Mqtt(Some("ok/topic".into())), "c", "agent"),
        ]);
        assert!(results[0].is_ok() && results[2].is_ok());
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("not queued") && err.contains("U+0000"), "{err}");
        let texts: Vec<_> = o.pending().unwrap().into_iter().map(|e| e.text).collect();
        assert_eq!(texts, ["a", "c"]);
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
    fn a_corrupt_outbox_of_an_earlier_version_is_kept_aside_not_wiped() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let legacy = dir.path().join("outbox.json");
        std::fs::write(&legacy, b"{ not json").unwrap();
        let err = o.pending().unwrap_err();
        let OutboxError::Corrupt { kept_as, .. } = err else { panic!("expected Corrupt, got {err}") };
        assert_eq!(std::fs::read(&kept_as).unwrap(), b"{ not json");
        // A fresh outbox starts after that.
        o.enqueue(Target::Log, "new", "agent").unwrap();
        assert_eq!(o.pending().unwrap().len(), 1);
        // A report queued onto it right away is not lost either.
        std::fs::write(&legacy, b"\x00garbage").unwrap();
        std::fs::remove_file(o.path()).unwrap();
        let fresh = Outbox::new(dir.path());
        fresh.enqueue(Target::Log, "must survive", "job:x").unwrap();
        assert_eq!(fresh.pending().unwrap()[0].text, "must survive");
    }

    #[test]
    fn journal_lines_of_today_read_back_and_write_back_byte_for_byte() {
        // As this version's journal has them: the source is its string on disk.
        let lines = [
            r#"{"add":{"id":1,"target":"log","text":"a","source":"job:backup","created":"2026-01-01T00:00:00Z","attempts":0}}"#,
            r#"{"add":{"id":2,"target":"mqtt","text":"b","source":"heartbeat","created":"2026-01-01T00:00:00Z","attempts":1,"last_error":"x"}}"#,
            r#"{"add":{"id":3,"target":"mqtt","text":"c","source":"alert","created":"2026-01-01T00:00:00Z","attempts":0}}"#,
            r#"{"add":{"id":4,"target":"log","text":"d","source":"trigger:zigbee2mqtt/+/door","created":"2026-01-01T00:00:00Z","attempts":0}}"#,
            r#"{"add":{"id":5,"target":"log","text":"e","source":"webhook:from-a-newer-build","created":"2026-01-01T00:00:00Z","attempts":0}}"#,
            r#"{"done":{"id":6,"target":"log","source":"agent","created":"2026-01-01T00:00:00Z","finished":"2026-01-01T00:00:01Z","outcome":"delivered"}}"#,
        ];
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("outbox.jsonl"), lines.join("\n") + "\n").unwrap();
        let o = Outbox::new(dir.path());
        let pending = o.pending().unwrap();
        let sources: Vec<&ReportSource> = pending.iter().map(|e| &e.source).collect();
        assert_eq!(
            sources,
            [
                &ReportSource::Job("backup".into()),
                &ReportSource::Heartbeat,
                &ReportSource::Alert,
                &ReportSource::Trigger("zigbee2mqtt/+/door".into()),
                &ReportSource::Other("webhook:from-a-newer-build".into()),
            ]
        );
        let recent = o.recent().unwrap();
        assert_eq!(recent[0].source, ReportSource::Agent);
        for (line, e) in lines.iter().zip(&pending) {
            assert_eq!(&serde_json::to_string(&Op::Add(e.clone())).unwrap(), line);
        }
        assert_eq!(&serde_json::to_string(&Op::Done(recent[0].clone())).unwrap(), lines.last().unwrap());
    }

    #[test]
    fn an_outbox_of_an_earlier_version_is_converted() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"version":1,"next_id":7,"pending":[{"id":7,"target":"log","text":"from before","source":"job:a","created":"2026-01-01T00:00:00Z","attempts":2,"last_error":"x"}],"recent":[{"id":6,"target":"log","source":"agent","created":"2026-01-01T00:00:00Z","finished":"2026-01-01T00:00:01Z","outcome":"delivered"}]}"#;
        std::fs::write(dir.path().join("outbox.json"), old).unwrap();
        let o = Outbox::new(dir.path());
        let pending = o.pending().unwrap();
        assert_eq!((pending[0].id, pending[0].text.as_str(), pending[0].attempts), (7, "from before", 2));
        assert_eq!(o.recent().unwrap()[0].id, 6);
        assert!(!dir.path().join("outbox.json").exists(), "converted, not kept twice");
        assert_eq!(o.enqueue(Target::Log, "next", "agent").unwrap(), 8, "ids go on");
    }

    #[test]
    fn reports_are_appended_not_rewritten_and_the_journal_is_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        let ino = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(o.path()).unwrap());
        let first = o.enqueue(Target::Log, "one", "agent").unwrap();
        let inode = ino();
        let ids: Vec<u64> = o
            .enqueue_many(
                (0..3).map(|i| super::super::Outgoing::new(Target::Mqtt(None), format!("r{i}"), "job:x")).collect(),
            )
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(ids, [first + 1, first + 2, first + 3]);
        o.record_many(vec![(first, Attempt::Delivered), (ids[0], Attempt::Retry("down".into()))], Timestamp::now())
            .unwrap();
        assert_eq!(ino(), inode, "appended to the same file");
        let lines = std::fs::read_to_string(o.path()).unwrap().lines().count();
        assert_eq!(lines, 6, "4 adds, 1 set, 1 done");
        // Another process's handle sees the same.
        let other = Outbox::new(dir.path());
        assert_eq!(other.pending().unwrap().len(), 3);
        assert_eq!(other.pending().unwrap()[0].attempts, 1);
        // Many reports later the journal is replaced by a short one, with the same content.
        for i in 0..COMPACT_SLACK {
            let id = o.enqueue(Target::Log, &i.to_string(), "agent").unwrap();
            o.record(id, Attempt::Delivered, Timestamp::now()).unwrap();
        }
        assert_ne!(ino(), inode, "compacted");
        let lines = std::fs::read_to_string(o.path()).unwrap().lines().count();
        assert!(lines < 6 + 2 * COMPACT_SLACK, "{lines} lines: compacted on the way");
        let texts = |o: &Outbox| o.pending().unwrap().into_iter().map(|e| e.text).collect::<Vec<_>>();
        assert_eq!(texts(&o), ["r0", "r1", "r2"]);
        assert_eq!(texts(&other), ["r0", "r1", "r2"], "the other handle reads the new file");
        assert_eq!(other.recent().unwrap().len(), RECENT_KEPT);
    }

    #[test]
    fn a_torn_tail_and_unreadable_lines_lose_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        o.enqueue(Target::Log, "kept", "agent").unwrap();
        // A power cut mid-append, and a line damaged on the card.
        let mut f = std::fs::OpenOptions::new().append(true).open(o.path()).unwrap();
        f.write_all(b"not json at all\n{\"add\":{\"id\":9,\"tar").unwrap();
        drop(f);
        let fresh = Outbox::new(dir.path());
        assert_eq!(fresh.pending().unwrap().len(), 1);
        fresh.enqueue(Target::Log, "after", "agent").unwrap();
        let texts: Vec<_> = Outbox::new(dir.path()).pending().unwrap().into_iter().map(|e| e.text).collect();
        assert_eq!(texts, ["kept", "after"], "the new line is whole");
        // At compaction the damaged journal is kept aside.
        for i in 0..COMPACT_SLACK {
            let id = fresh.enqueue(Target::Log, &i.to_string(), "agent").unwrap();
            fresh.record(id, Attempt::Delivered, Timestamp::now()).unwrap();
        }
        let kept = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("outbox.jsonl.corrupt-"));
        assert!(kept, "a copy of the damaged journal is kept");
        assert_eq!(fresh.pending().unwrap().len(), 2);
    }

    #[test]
    fn a_failed_append_leaves_no_half_line() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(dir.path());
        o.enqueue(Target::Log, "a", "agent").unwrap();
        let len = std::fs::metadata(o.path()).unwrap().len();
        full(&o, true);
        assert!(o.enqueue(Target::Log, "b", "agent").is_err());
        full(&o, false);
        assert_eq!(std::fs::metadata(o.path()).unwrap().len(), len);
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
