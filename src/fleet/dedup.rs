//! The primary's memory of the reports it took from nodes, by idempotency
//! key (`<board>:<job>@<slot>`): a node's outbox sends a report until the
//! broker acknowledges it, so the same report can arrive twice (a lost
//! PUBACK, a node restart); the second is dropped here. Kept in
//! `<state>/fleet-delivered.json` across restarts, within a window
//! (`[fleet] dedup_window`) and a count, so it cannot grow without bound.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Keys remembered at most (the oldest go first).
pub const MAX_KEYS: usize = 20_000;

pub struct Delivered {
    path: PathBuf,
    window: i64,
    keys: BTreeMap<String, i64>,
}

impl Delivered {
    /// Read `<state>/fleet-delivered.json` (missing or unreadable: empty, said once in the log).
    pub fn open(state_dir: &Path, window: std::time::Duration) -> Delivered {
        let path = state_dir.join("fleet-delivered.json");
        let keys = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), "fleet: the delivered reports' keys are unreadable ({e}); starting empty");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Delivered { path, window: i64::try_from(window.as_secs()).unwrap_or(i64::MAX), keys }
    }

    /// Whether `key` was taken already (within the window).
    pub fn seen(&self, key: &str, now: i64) -> bool {
        self.keys.get(key).is_some_and(|t| now.saturating_sub(*t) <= self.window)
    }

    /// Remember `key` (and forget the expired ones); the file's new content,
    /// for the caller to write off the runtime's threads ([`Snapshot::write`] syncs).
    pub fn remember(&mut self, key: &str, now: i64) -> Snapshot {
        let oldest = now.saturating_sub(self.window);
        self.keys.retain(|_, t| *t >= oldest);
        while self.keys.len() >= MAX_KEYS {
            let Some(first) = self.keys.iter().min_by_key(|(_, t)| **t).map(|(k, _)| k.clone()) else { break };
            self.keys.remove(&first);
        }
        self.keys.insert(key.to_string(), now);
        Snapshot { path: self.path.clone(), bytes: serde_json::to_vec(&self.keys).unwrap_or_default() }
    }
}

/// The delivered keys as they are to be written.
pub struct Snapshot {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Snapshot {
    /// Replace the file atomically (blocking: it syncs).
    pub fn write(self) -> std::io::Result<()> {
        crate::util::fs::write_atomic(&self.path, &self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_dropped_again_after_a_restart_within_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let day = std::time::Duration::from_secs(86400);
        let mut d = Delivered::open(dir.path(), day);
        assert!(!d.seen("garage:backup@1", 1000));
        d.remember("garage:backup@1", 1000).write().unwrap();
        assert!(d.seen("garage:backup@1", 1001));
        let d = Delivered::open(dir.path(), day);
        assert!(d.seen("garage:backup@1", 2000), "kept across a restart");
        assert!(!d.seen("garage:backup@1", 1000 + 86401), "forgotten after the window");
        assert!(!d.seen("garage:backup@2", 2000));
        std::fs::write(dir.path().join("fleet-delivered.json"), b"{").unwrap();
        assert!(!Delivered::open(dir.path(), day).seen("garage:backup@1", 2000), "a broken file starts empty");
    }
}
