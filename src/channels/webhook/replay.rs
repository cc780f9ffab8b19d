//! The replay cache: a signature is accepted once. A signed request carries
//! its time, and one older than ±5 minutes is refused anyway, so only the
//! signatures of the last 5 minutes are kept — in memory, and in
//! `<state>/webhook-seen` so that a request captured just before a restart
//! (or a reload) cannot be replayed just after it. One short line is
//! appended per accepted call (no flush of its own: a power cut can lose the
//! last few, reopening their window for what is left of 5 minutes); the file
//! is rewritten with what is still in the window when the daemon starts.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::clients::webhook::TOLERANCE_SECS;

/// Signatures remembered at most (within the window).
pub const REPLAY_MAX: usize = 4096;

/// Recently accepted signatures, by endpoint and MAC.
#[derive(Default)]
pub struct ReplayCache {
    seen: VecDeque<(i64, String, Vec<u8>)>,
    file: Option<PathBuf>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

impl ReplayCache {
    /// The cache kept in `<state_dir>/webhook-seen`, with what it holds from
    /// before that is still in the window at `now`.
    pub fn open(state_dir: &Path, now: i64) -> ReplayCache {
        let path = state_dir.join("webhook-seen");
        let mut cache = ReplayCache { seen: VecDeque::new(), file: None };
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            let mut parts = line.split(' ');
            let (Some(t), Some(name), Some(mac)) = (parts.next(), parts.next(), parts.next()) else { continue };
            if let (Ok(t), Some(mac)) = (t.parse::<i64>(), unhex(mac)) {
                if (now - t).abs() <= TOLERANCE_SECS && cache.seen.len() < REPLAY_MAX {
                    cache.seen.push_back((t, name.to_string(), mac));
                }
            }
        }
        let kept: String = cache.seen.iter().map(|(t, n, m)| format!("{t} {n} {}\n", hex(m))).collect();
        match crate::util::fs::write_atomic_relaxed(&path, kept.as_bytes()) {
            Ok(()) => cache.file = Some(path),
            Err(e) => tracing::warn!(
                "webhooks: cannot write {} ({e}): signatures are remembered in memory only, until a restart",
                path.display()
            ),
        }
        cache
    }

    /// Remember a verified signature; an error if it was seen (a replay) or
    /// the cache is full of signatures still inside their window.
    pub fn first_time(&mut self, endpoint: &str, t: i64, mac: &[u8], now: i64) -> Result<(), &'static str> {
        self.seen.retain(|(seen_t, _, _)| (now - seen_t).abs() <= TOLERANCE_SECS);
        if self.seen.iter().any(|(_, e, m)| e == endpoint && m == mac) {
            return Err("a replay of a request already accepted");
        }
        if self.seen.len() >= REPLAY_MAX {
            return Err("too many signed requests in five minutes to remember");
        }
        if let Some(path) = &self.file {
            let line = format!("{t} {endpoint} {}\n", hex(mac));
            let written = crate::util::fs::open_append_private(path).and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = written {
                tracing::warn!(
                    "webhooks: cannot append to {} ({e}): this signature is remembered in memory only",
                    path.display()
                );
            }
        }
        self.seen.push_back((t, endpoint.to_string(), mac.to_vec()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_accepted_once_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ReplayCache::open(dir.path(), 100);
        assert!(c.first_time("door", 100, b"mac", 100).is_ok());
        assert!(c.first_time("door", 100, b"mac", 150).is_err(), "a replay");
        assert!(c.first_time("other", 100, b"mac", 150).is_ok(), "another endpoint's");
        let mut again = ReplayCache::open(dir.path(), 200);
        assert!(again.first_time("door", 100, b"mac", 200).is_err(), "remembered across a restart");
        // Out of the window it is forgotten (and its timestamp refused as stale by then).
        assert!(ReplayCache::open(dir.path(), 100 + 301).first_time("door", 100, b"mac", 401).is_ok());
        let mut full = ReplayCache::default();
        for i in 0..REPLAY_MAX {
            full.first_time("d", 5, &i.to_be_bytes(), 5).unwrap();
        }
        assert!(full.first_time("d", 5, b"new", 5).is_err(), "bounded");
    }
}
