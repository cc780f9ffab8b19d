//! Unanswered messages: a user's message must survive a crash mid-turn.
//!
//! A turn's messages reach the session file only when it ends (see
//! [`super::session`]), so a power cut mid-turn leaves the session exactly as
//! before — and would silently drop the user's message. To avoid that, every
//! chat turn appends a `begin` line to its process's journal
//! `<state>/pending/<pid>-<start>.jsonl` when it starts, flushed
//! (`fdatasync`) once the turn has run [`SYNC_AFTER`] — a turn that commits
//! sooner has its message on disk in the session by then, and skips this
//! flush — and an `end` line when it is committed or answered with an error. At the
//! next start, begun turns without an end whose process is gone are taken:
//! the user is told on their channel that the message was not answered, or it
//! is run again (`[agent] unanswered = "report" | "rerun"`).
//!
//! One append per turn instead of a file per turn (temp file, fsync, rename,
//! directory fsync, then an unlink): the SD card sees one small write and one
//! flush. Turns that begin together share the flush (group commit: a turn
//! whose line another turn's `fdatasync` already covered does not call it
//! again; the journal's directory entry is flushed with its first flushed
//! line, so a process whose turns are all short never flushes it). The
//! `end` line is not flushed: a power cut may lose it, and the
//! user is then told of a message that was in fact answered — never the
//! reverse. A journal whose turns have all ended is emptied once it passes
//! 64 KiB, and a dead process's journal is deleted once taken.
//!
//! A journal names its process by pid *and* start time (from `/proc`), so the
//! turns of another running bramble process (the daemon, while `bramble
//! agent` starts) are never taken, and pid reuse cannot fool it. Within the
//! process, a store remembers its turns still running, so a daemon reload
//! (SIGHUP) takes the records its stopped turns left behind. Records of
//! earlier versions (`<pid>-<n>.json`, one per turn) are still taken.
//!
//! A [`PendingStore`] is a value, made with the agent (its clones share it):
//! no process-wide table. A reload makes a new one on the same file while the
//! old one may still be dropping; the two never clash: the new store numbers
//! its turns after the highest number in the file, and every append and the
//! old store's last clean-up take the file's `flock`, an append to a file
//! the clean-up removed going to a fresh one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use nix::fcntl::{Flock, FlockArg};

use crate::bus::{Conversation, Target};
use crate::util;

/// One turn in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTurn {
    /// Stored flat: `session_key`, `channel`, `chat_id`.
    #[serde(flatten)]
    pub conversation: Conversation,
    pub text: String,
    /// RFC 3339.
    pub started: String,
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub proc_start: u64,
}

impl PendingTurn {
    /// Where the answer would have gone.
    pub fn target(&self) -> Target {
        self.conversation.reply_target()
    }

    /// What the user is told.
    pub fn notice(&self, tz: &crate::config::TzName) -> String {
        let when = self
            .started
            .parse::<jiff::Timestamp>()
            .map(|t| t.to_zoned(tz.tz().clone()).strftime("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|_| self.started.clone());
        let text = crate::tools::truncate_middle(self.text.trim(), 200);
        format!(
            "Your message “{text}” (sent {when}) was not answered because bramble stopped. Send it again if it still matters."
        )
    }
}

/// A begun turn, for [`PendingStore::finish`] and [`PendingStore::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PendingId {
    id: u64,
    /// Its line's sequence number in the journal (for [`PendingStore::sync`]).
    seq: u64,
}

/// How long a turn may run before its `begin` line is flushed. A turn that
/// commits sooner never needs it: the session's flush holds the message then.
pub const SYNC_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// One line of a journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Begin { begin: u64, turn: PendingTurn },
    End { end: u64 },
}

impl Line {
    /// The turn the line is about.
    fn id(&self) -> u64 {
        match self {
            Line::Begin { begin, .. } => *begin,
            Line::End { end } => *end,
        }
    }
}

/// A journal this size or larger is emptied once all its turns have ended.
const COMPACT_AT: u64 = 64 * 1024;

/// The journals under `<state>/pending/`. Clones share this store's journal.
#[derive(Debug, Clone)]
pub struct PendingStore {
    dir: PathBuf,
    journal: Arc<Journal>,
}

/// This process's journal in one state directory, as one store writes it:
/// the open file, how far it is flushed, the turns still running. When the
/// store's last clone goes, a journal whose turns all ended is removed.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
    /// This process's start time (`/proc/self/stat`), read once.
    proc_start: u64,
    file: Mutex<Option<Arc<File>>>,
    /// Lines written (a sequence number per `begin`).
    written: AtomicU64,
    /// The highest sequence number known to be on disk.
    synced: Mutex<u64>,
    /// Whether the journal's directory entry is on disk: flushed with the
    /// first `sync` (a journal nobody syncs — short turns only — needs none).
    dir_synced: AtomicBool,
    /// Names this store's turns: after every number already in the file.
    next: AtomicU64,
    /// This store's turns that are still running.
    active: Mutex<BTreeSet<u64>>,
    /// Held while this store appends to or empties the journal.
    appending: Mutex<()>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PendingStore {
    pub fn new(state_dir: &Path) -> PendingStore {
        let dir = state_dir.join("pending");
        let pid = std::process::id();
        let proc_start = process_start(pid).unwrap_or(0);
        let path = dir.join(format!("{pid}-{proc_start}.jsonl"));
        // An earlier store of this process (before a reload) numbered turns in it.
        let first = read_journal(&path).map_or(0, |lines| lines.iter().map(Line::id).max().unwrap_or(0)) + 1;
        let journal = Arc::new(Journal {
            path,
            proc_start,
            file: Mutex::default(),
            written: AtomicU64::default(),
            synced: Mutex::default(),
            dir_synced: AtomicBool::new(false),
            next: AtomicU64::new(first),
            active: Mutex::default(),
            appending: Mutex::default(),
        });
        PendingStore { dir, journal }
    }

    /// This process's journal file.
    fn own_path(&self) -> PathBuf {
        self.journal.path.clone()
    }

    /// This process's journal, opened (and created) on first use. Its
    /// directory entry is made durable by the first [`sync`](Self::sync).
    fn file(&self) -> std::io::Result<Arc<File>> {
        let mut slot = guard(&self.journal.file);
        if let Some(f) = slot.as_ref() {
            return Ok(Arc::clone(f));
        }
        self.open_file(&mut slot)
    }

    /// Open (and create) the journal into `slot`.
    fn open_file(&self, slot: &mut Option<Arc<File>>) -> std::io::Result<Arc<File>> {
        util::fs::create_private_dir(&self.dir)?;
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .mode(util::fs::FILE_MODE)
                .open(self.own_path())?,
        );
        // A new file's name is not on disk yet: the next `sync` flushes it.
        self.journal.dir_synced.store(false, Ordering::SeqCst);
        *slot = Some(Arc::clone(&file));
        Ok(file)
    }

    /// Record a turn that starts now; it is on disk when this returns.
    pub fn begin(&self, conversation: &Conversation, text: &str) -> std::io::Result<PendingId> {
        let id = self.begin_unsynced(conversation, text)?;
        self.sync(id)?;
        Ok(id)
    }

    /// Record a turn that starts now, without waiting for the disk: call
    /// [`sync`](Self::sync) once the turn has run [`SYNC_AFTER`] (the agent
    /// does), so a short turn costs one flush (its session's), not two.
    pub fn begin_unsynced(&self, conversation: &Conversation, text: &str) -> std::io::Result<PendingId> {
        let pid = std::process::id();
        let id = self.journal.next.fetch_add(1, Ordering::Relaxed);
        let turn = PendingTurn {
            conversation: conversation.clone(),
            text: text.into(),
            started: super::session::now_rfc3339(),
            pid,
            proc_start: self.journal.proc_start,
        };
        let mut line = serde_json::to_vec(&Line::Begin { begin: id, turn }).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let seq = {
            let _appending = guard(&self.journal.appending);
            let (file, _lock) = self.locked_file()?;
            append_whole(&file, &line)?;
            self.journal.written.fetch_add(1, Ordering::SeqCst) + 1
        };
        guard(&self.journal.active).insert(id);
        Ok(PendingId { id, seq })
    }

    /// Make the turn's `begin` line durable. Group commit: one flush covers
    /// every line written before it started, so turns flushing together
    /// call `fdatasync` once.
    pub fn sync(&self, id: PendingId) -> std::io::Result<()> {
        let mut synced = guard(&self.journal.synced);
        if *synced < id.seq {
            let upto = self.journal.written.load(Ordering::SeqCst);
            self.file()?.sync_data()?;
            if !self.journal.dir_synced.load(Ordering::SeqCst) {
                // The file's name too, once: a line on disk in a file no directory names is lost.
                util::fs::sync_dir(&self.dir)?;
                self.journal.dir_synced.store(true, Ordering::SeqCst);
            }
            *synced = upto;
        }
        Ok(())
    }

    /// The turn ended without an answer (cut off by shutdown): the record stays
    /// for the next start. After [`finish`](Self::finish) this does nothing.
    pub fn release(&self, id: PendingId) {
        guard(&self.journal.active).remove(&id.id);
    }

    /// The turn was committed or answered: forget it (not flushed, see the module docs).
    pub fn finish(&self, id: PendingId) {
        guard(&self.journal.active).remove(&id.id);
        if let Err(e) = self.end(&[id.id]) {
            tracing::warn!(dir = %self.dir.display(), "cannot mark a pending turn as answered: {e}");
        }
    }

    /// Append `end` lines for `ids` to this process's journal; empty it when
    /// it is large and every turn in it has ended.
    fn end(&self, ids: &[u64]) -> std::io::Result<()> {
        let mut lines = Vec::new();
        for &end in ids {
            serde_json::to_writer(&mut lines, &Line::End { end }).map_err(std::io::Error::other)?;
            lines.push(b'\n');
        }
        let _appending = guard(&self.journal.appending);
        let (file, _lock) = self.locked_file()?;
        append_whole(&file, &lines)?;
        if file.metadata()?.len() >= COMPACT_AT && open_turns(&read_journal(&self.own_path())?).is_empty() {
            file.set_len(0)?;
        }
        Ok(())
    }

    /// Take the unanswered turns of processes that are gone (and this
    /// process's turns that stopped without an answer) that `wanted` accepts,
    /// oldest first. Each is taken once; the others stay.
    pub fn take_orphans(&self, wanted: impl Fn(&PendingTurn) -> bool) -> Vec<PendingTurn> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let own = self.own_path();
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("jsonl") if path == own => self.take_own(&wanted, &mut out),
                Some("jsonl") => take_dead(&path, &wanted, &mut out),
                Some("json") => take_legacy(&path, &wanted, &mut out),
                _ => {}
            }
        }
        out.sort_by(|a, b| a.started.cmp(&b.started));
        out
    }

    /// This process's turns that stopped without an answer (a reload).
    fn take_own(&self, wanted: &impl Fn(&PendingTurn) -> bool, out: &mut Vec<PendingTurn>) {
        let own = self.own_path();
        let taken: Vec<(u64, PendingTurn)> = {
            let _appending = guard(&self.journal.appending);
            let Ok(lines) = read_journal(&own) else { return };
            let active = guard(&self.journal.active);
            open_turns(&lines).into_iter().filter(|(id, t)| !active.contains(id) && wanted(t)).collect()
        };
        if taken.is_empty() {
            return;
        }
        let ids: Vec<u64> = taken.iter().map(|(id, _)| *id).collect();
        if let Err(e) = self.end(&ids) {
            tracing::warn!(file = %own.display(), "cannot mark unanswered turns as taken: {e}");
        }
        out.extend(taken.into_iter().map(|(_, t)| t));
    }

    /// The journal under its `flock`, for an append: if the store of an
    /// earlier generation removed the file meanwhile (see [`Journal`]'s drop),
    /// a fresh one. The caller holds `appending`.
    fn locked_file(&self) -> std::io::Result<(Arc<File>, Flock<File>)> {
        use std::os::unix::fs::MetadataExt;
        let mut slot = guard(&self.journal.file);
        let file = match slot.as_ref() {
            Some(f) => Arc::clone(f),
            None => self.open_file(&mut slot)?,
        };
        let lock = flock(&file)?;
        if file.metadata()?.nlink() > 0 {
            return Ok((file, lock));
        }
        drop(lock);
        let file = self.open_file(&mut slot)?;
        let lock = flock(&file)?;
        Ok((file, lock))
    }
}

/// An exclusive `flock` on `file`'s open file, held until the value is dropped.
fn flock(file: &File) -> std::io::Result<Flock<File>> {
    Flock::lock(file.try_clone()?, FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
}

impl Drop for Journal {
    fn drop(&mut self) {
        if guard(&self.file).is_none() {
            return;
        }
        // Under the file's lock: a new store (a reload) may be appending to it.
        let Ok(file) = File::open(&self.path) else { return };
        let Ok(_lock) = flock(&file) else { return };
        // Turns cut off by the stop, or begun by a newer store, stay.
        if read_journal(&self.path).is_ok_and(|lines| open_turns(&lines).is_empty()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Take the unanswered turns of another process's journal, if that process is
/// gone; the journal is deleted when nothing is left in it.
fn take_dead(path: &Path, wanted: &impl Fn(&PendingTurn) -> bool, out: &mut Vec<PendingTurn>) {
    let owner = path.file_stem().and_then(|s| s.to_str()).and_then(|s| {
        let (pid, start) = s.split_once('-')?;
        Some((pid.parse::<u32>().ok()?, start.parse::<u64>().ok()?))
    });
    if owner.is_some_and(|(pid, start)| is_alive(pid, start)) {
        return;
    }
    // Two processes starting at once must not both take the same turns.
    let Ok(file) = std::fs::OpenOptions::new().read(true).append(true).open(path) else { return };
    let Ok(file) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive) else { return };
    let lines = match read_journal(path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(file = %path.display(), "cannot read a pending-turn journal: {e}");
            return;
        }
    };
    let open = open_turns(&lines);
    let (taken, kept): (Vec<_>, Vec<_>) = open.into_iter().partition(|(_, t)| wanted(t));
    if kept.is_empty() {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(file = %path.display(), "cannot remove a pending-turn journal: {e}");
        }
    } else if !taken.is_empty() {
        let mut lines = Vec::new();
        for (end, _) in &taken {
            let _ = serde_json::to_writer(&mut lines, &Line::End { end: *end });
            lines.push(b'\n');
        }
        if let Err(e) = append_whole(&file, &lines) {
            tracing::warn!(file = %path.display(), "cannot mark unanswered turns as taken: {e}");
        }
    }
    out.extend(taken.into_iter().map(|(_, t)| t));
}

/// A record of an earlier version: one file per turn.
fn take_legacy(path: &Path, wanted: &impl Fn(&PendingTurn) -> bool, out: &mut Vec<PendingTurn>) {
    let record = match std::fs::read(path).map(|b| serde_json::from_slice::<PendingTurn>(&b)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(file = %path.display(), "removing an unreadable pending-turn record: {e}");
            let _ = std::fs::remove_file(path);
            return;
        }
        Err(_) => return,
    };
    if is_alive(record.pid, record.proc_start) || !wanted(&record) {
        return;
    }
    match std::fs::remove_file(path) {
        Ok(()) => out.push(record),
        // Another process took it first.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %path.display(), "cannot remove a pending-turn record: {e}"),
    }
}

/// Append `lines` to a journal opened for reading and appending; a torn
/// last line (a power cut, a full disk) is ended first, so ours stay whole.
fn append_whole(file: &File, lines: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut last = [b'\n'];
    if len > 0 {
        file.read_exact_at(&mut last, len - 1)?;
    }
    if last[0] != b'\n' {
        let mut whole = Vec::with_capacity(lines.len() + 1);
        whole.push(b'\n');
        whole.extend_from_slice(lines);
        return (&*file).write_all(&whole);
    }
    (&*file).write_all(lines)
}

/// The lines of a journal; a torn or unreadable line (a power cut mid-append) is skipped.
fn read_journal(path: &Path) -> std::io::Result<Vec<Line>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in std::io::BufReader::new(file).split(b'\n') {
        if let Ok(l) = serde_json::from_slice::<Line>(&line?) {
            out.push(l);
        }
    }
    Ok(out)
}

/// The turns begun and not ended, by id.
fn open_turns(lines: &[Line]) -> Vec<(u64, PendingTurn)> {
    let mut open: BTreeMap<u64, &PendingTurn> = BTreeMap::new();
    for line in lines {
        match line {
            Line::Begin { begin, turn } => {
                open.insert(*begin, turn);
            }
            Line::End { end } => {
                open.remove(end);
            }
        }
    }
    open.into_iter().map(|(id, t)| (id, t.clone())).collect()
}

/// Whether the process that wrote a record still runs.
fn is_alive(pid: u32, proc_start: u64) -> bool {
    match process_start(pid) {
        Some(start) => proc_start == 0 || start == proc_start,
        None => false,
    }
}

/// A process's start time in clock ticks since boot, from `/proc/<pid>/stat`.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_live_processes_are_kept_dead_ones_taken() {
        let dir = tempfile::tempdir().unwrap();
        let store = PendingStore::new(dir.path());
        let mine = store
            .begin(&Conversation::new(crate::bus::Channel::Telegram, "1", "telegram:1"), "turn on the heater")
            .unwrap();
        assert!(store.take_orphans(|_| true).is_empty(), "this turn is running");
        let cut_off = store
            .begin(&Conversation::new(crate::bus::Channel::Telegram, "1", "telegram:1"), "cut off by a reload")
            .unwrap();
        store.release(cut_off);
        let taken = store.take_orphans(|_| true);
        assert_eq!(taken.len(), 1, "a released record of this process is taken");
        assert_eq!(taken[0].text, "cut off by a reload");
        assert!(store.take_orphans(|_| true).is_empty(), "taken once");

        // A journal of a process that is gone (a pid that cannot exist), and a
        // record of an earlier version.
        let dead = PendingTurn {
            conversation: Conversation::cli("cli:direct"),
            text: "hello".into(),
            started: "2026-05-01T10:00:00Z".into(),
            pid: u32::MAX - 1,
            proc_start: 1,
        };
        let tg = PendingTurn {
            conversation: Conversation::new(crate::bus::Channel::Telegram, "7", "telegram:7"),
            ..dead.clone()
        };
        let mut journal = Vec::new();
        for (id, t) in [(1, &dead), (2, &tg)] {
            serde_json::to_writer(&mut journal, &Line::Begin { begin: id, turn: t.clone() }).unwrap();
            journal.push(b'\n');
        }
        // An answered turn, and the torn tail a power cut leaves.
        journal.extend_from_slice(b"{\"begin\":3,\"turn\":{\"session_key\":\"x\",\"channel\":\"cli\",\"chat_id\":\"\",\"text\":\"answered\",\"started\":\"2026-05-01T09:00:00Z\",\"pid\":4294967294,\"proc_start\":1}}\n{\"end\":3}\n{\"begin\":4,\"tu");
        let dead_journal = dir.path().join(format!("pending/{}-1.jsonl", u32::MAX - 1));
        std::fs::write(&dead_journal, &journal).unwrap();
        let legacy = PendingTurn {
            text: "from an older bramble".into(),
            started: "2026-04-01T10:00:00Z".into(),
            ..dead.clone()
        };
        std::fs::write(dir.path().join("pending/99-3.json"), serde_json::to_vec(&legacy).unwrap()).unwrap();

        let taken = store.take_orphans(|r| r.conversation.channel == crate::bus::Channel::Telegram);
        assert_eq!(taken, vec![tg.clone()], "filtered: only telegram");
        assert!(dead_journal.exists(), "the cli turn is still in it");
        let taken = store.take_orphans(|_| true);
        assert_eq!(taken, vec![legacy.clone(), dead.clone()], "oldest first");
        assert!(store.take_orphans(|_| true).is_empty(), "taken once");
        assert!(!dead_journal.exists(), "a dead journal is removed once empty");
        let notice = dead.notice(&"UTC".parse().unwrap());
        assert_eq!(
            notice,
            "Your message “hello” (sent 2026-05-01 10:00) was not answered because bramble stopped. Send it again if it still matters."
        );
        assert_eq!(dead.target(), Target::Cli);

        store.finish(mine);
        assert!(store.take_orphans(|_| true).is_empty());
        let left: Vec<_> = std::fs::read_dir(dir.path().join("pending")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(left, vec![store.own_path()], "only this process's journal");
        let (own, again) = (store.own_path(), store.clone());
        drop(store);
        assert!(own.exists(), "another store on the directory still uses it");
        drop(again);
        assert!(!own.exists(), "removed with the last store: every turn in it ended");
    }

    #[test]
    fn a_reloads_new_store_shares_the_file_with_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let chat = Conversation::new(crate::bus::Channel::Telegram, "1", "telegram:1");
        let old = PendingStore::new(dir.path());
        let cut_off = old.begin(&chat, "cut off by the reload").unwrap();
        old.release(cut_off);
        let new = PendingStore::new(dir.path());
        assert_eq!(new.own_path(), old.own_path(), "one journal per process");
        let taken = new.take_orphans(|_| true);
        assert_eq!(taken.len(), 1, "the new store takes what the old one's stop left");
        let running = new.begin(&chat, "after the reload").unwrap();
        assert!(running.id > cut_off.id, "numbered after the old store's turns");
        drop(old);
        assert!(new.own_path().exists(), "the old store's clean-up keeps a journal with a running turn");
        new.finish(running);

        // An old store that goes while the journal has no turn open removes
        // it; the new one's next turn goes to a fresh file.
        let older = PendingStore::new(dir.path());
        let id = older.begin(&chat, "x").unwrap();
        older.finish(id);
        drop(older);
        assert!(!new.own_path().exists());
        let next = new.begin(&chat, "written after the clean-up").unwrap();
        new.release(next);
        assert_eq!(new.take_orphans(|_| true)[0].text, "written after the clean-up");
    }

    #[test]
    fn a_large_journal_whose_turns_all_ended_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let store = PendingStore::new(dir.path());
        let text = "x".repeat(2000);
        let running = store.begin(&Conversation::cli("cli:a"), "still running").unwrap();
        for _ in 0..40 {
            let id = store.begin(&Conversation::cli("cli:b"), &text).unwrap();
            store.finish(id);
        }
        let len = || std::fs::metadata(store.own_path()).unwrap().len();
        assert!(len() > COMPACT_AT, "a running turn keeps the journal");
        store.finish(running);
        assert_eq!(len(), 0, "emptied once all ended and large");
        // It works on after that.
        let next = store.begin(&Conversation::cli("cli:c"), "after").unwrap();
        store.release(next);
        assert_eq!(store.take_orphans(|_| true)[0].text, "after");
    }

    #[test]
    fn turns_begun_together_share_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = PendingStore::new(dir.path());
        std::thread::scope(|s| {
            for i in 0..8 {
                let store = store.clone();
                s.spawn(move || {
                    let id = store.begin(&Conversation::cli(format!("cli:{i}")), "hi").unwrap();
                    store.finish(id);
                });
            }
        });
        assert_eq!(store.journal.written.load(Ordering::SeqCst), 8);
        assert_eq!(*guard(&store.journal.synced), 8, "every line is covered by a flush");
        let lines = read_journal(&store.own_path()).unwrap();
        assert_eq!(lines.len(), 16);
        assert!(open_turns(&lines).is_empty());
    }

    #[test]
    fn the_record_format_is_flat() {
        // Written by earlier versions: the three conversation fields at the top level.
        let old = r#"{"session_key":"telegram:9","channel":"telegram","chat_id":"9","text":"hi","started":"2026-05-01T10:00:00Z","pid":7,"proc_start":3}"#;
        let record: PendingTurn = serde_json::from_str(old).unwrap();
        assert_eq!(record.conversation, Conversation::new(crate::bus::Channel::Telegram, "9", "telegram:9"));
        let written: serde_json::Value = serde_json::to_value(&record).unwrap();
        assert_eq!(written, serde_json::from_str::<serde_json::Value>(old).unwrap());
    }

    #[test]
    fn own_start_time_is_read() {
        assert!(process_start(std::process::id()).is_some_and(|t| t > 0));
        assert!(process_start(u32::MAX - 1).is_none());
    }
}
