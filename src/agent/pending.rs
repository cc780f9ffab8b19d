//! Unanswered messages: a user's message must survive a crash mid-turn.
//!
//! A turn's messages reach the session file only when it ends (see
//! [`super::session`]), so a power cut mid-turn leaves the session exactly as
//! before — and would silently drop the user's message. To avoid that, every
//! chat turn writes a small record to `<state>/pending/` (atomically) when it
//! starts and removes it when it is committed or answered with an error. At
//! the next start, records whose process is gone are taken: the user is told
//! on their channel that the message was not answered, or it is run again
//! (`[agent] unanswered = "report" | "rerun"`).
//!
//! A record names its process by pid *and* start time (from `/proc`), so a
//! record of a turn still running in another bramble process (the daemon,
//! while `bramble agent` starts) is never taken, and pid reuse cannot fool it.
//! Within the process, records of turns still running are remembered, so a
//! daemon reload (SIGHUP) takes the records its stopped turns left behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

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

/// The records under `<state>/pending/`.
#[derive(Debug, Clone)]
pub struct PendingStore {
    dir: PathBuf,
}

/// Names records within this process.
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Records of this process's turns that are still running.
static ACTIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn active() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner())
}

impl PendingStore {
    pub fn new(state_dir: &Path) -> PendingStore {
        PendingStore { dir: state_dir.join("pending") }
    }

    /// Record a turn that starts now. Returns the record's path (for [`finish`](Self::finish)).
    pub fn begin(&self, conversation: &Conversation, text: &str) -> std::io::Result<PathBuf> {
        let pid = std::process::id();
        let record = PendingTurn {
            conversation: conversation.clone(),
            text: text.into(),
            started: super::session::now_rfc3339(),
            pid,
            proc_start: process_start(pid).unwrap_or(0),
        };
        let path = self.dir.join(format!("{pid}-{}.json", NEXT.fetch_add(1, Ordering::Relaxed)));
        let body = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        util::fs::write_atomic(&path, &body)?;
        active().insert(path.clone());
        Ok(path)
    }

    /// The turn ended without an answer (cut off by shutdown): the record stays
    /// for the next start. After [`finish`](Self::finish) this does nothing.
    pub fn release(&self, path: &Path) {
        active().remove(path);
    }

    /// The turn was committed or answered: forget it.
    pub fn finish(&self, path: &Path) {
        active().remove(path);
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %path.display(), "cannot remove a pending-turn record: {e}"),
        }
    }

    /// Take (read and remove) the records of processes that are gone and that
    /// `wanted` accepts, oldest first. Unreadable records are logged and removed.
    pub fn take_orphans(&self, wanted: impl Fn(&PendingTurn) -> bool) -> Vec<PendingTurn> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let record = match std::fs::read(&path).map(|b| serde_json::from_slice::<PendingTurn>(&b)) {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::warn!(file = %path.display(), "removing an unreadable pending-turn record: {e}");
                    self.finish(&path);
                    continue;
                }
                Err(_) => continue,
            };
            let running = if record.pid == std::process::id() {
                active().contains(&path)
            } else {
                is_alive(record.pid, record.proc_start)
            };
            if running || !wanted(&record) {
                continue;
            }
            self.finish(&path);
            out.push(record);
        }
        out.sort_by(|a, b| a.started.cmp(&b.started));
        out
    }
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
        let mine = store.begin(&Conversation::new("telegram", "1", "telegram:1"), "turn on the heater").unwrap();
        assert!(store.take_orphans(|_| true).is_empty(), "this turn is running");
        let cut_off = store.begin(&Conversation::new("telegram", "1", "telegram:1"), "cut off by a reload").unwrap();
        store.release(&cut_off);
        let taken = store.take_orphans(|_| true);
        assert_eq!(taken.len(), 1, "a released record of this process is taken");
        assert_eq!(taken[0].text, "cut off by a reload");

        // A record from a process that is gone (a pid that cannot exist).
        let dead = PendingTurn {
            conversation: Conversation::cli("cli:direct"),
            text: "hello".into(),
            started: "2026-05-01T10:00:00Z".into(),
            pid: u32::MAX - 1,
            proc_start: 1,
        };
        util::fs::write_atomic(&dir.path().join("pending/x.json"), &serde_json::to_vec(&dead).unwrap()).unwrap();
        assert!(store.take_orphans(|r| r.conversation.channel == "telegram").is_empty(), "filtered out");
        let taken = store.take_orphans(|_| true);
        assert_eq!(taken, vec![dead.clone()]);
        assert!(store.take_orphans(|_| true).is_empty(), "taken once");
        let notice = dead.notice(&"UTC".parse().unwrap());
        assert_eq!(
            notice,
            "Your message “hello” (sent 2026-05-01 10:00) was not answered because bramble stopped. Send it again if it still matters."
        );
        assert_eq!(dead.target(), Target::Cli);

        store.finish(&mine);
        assert_eq!(std::fs::read_dir(dir.path().join("pending")).unwrap().count(), 0);
    }

    #[test]
    fn the_record_format_is_flat() {
        // Written by earlier versions: the three conversation fields at the top level.
        let old = r#"{"session_key":"telegram:9","channel":"telegram","chat_id":"9","text":"hi","started":"2026-05-01T10:00:00Z","pid":7,"proc_start":3}"#;
        let record: PendingTurn = serde_json::from_str(old).unwrap();
        assert_eq!(record.conversation, Conversation::new("telegram", "9", "telegram:9"));
        let written: serde_json::Value = serde_json::to_value(&record).unwrap();
        assert_eq!(written, serde_json::from_str::<serde_json::Value>(old).unwrap());
    }

    #[test]
    fn own_start_time_is_read() {
        assert!(process_start(std::process::id()).is_some_and(|t| t > 0));
        assert!(process_start(u32::MAX - 1).is_none());
    }
}
