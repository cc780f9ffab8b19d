//! Accepted `message` calls, kept on disk from before the caller hears
//! `202 Accepted` until their turn has run. A daemon that is killed, loses
//! power or stops with calls still waiting runs them at its next start:
//! "accepted" means the call will run, not that it was in a queue in memory.
//!
//! One small file per call in `<state>/webhook-spool/` (0600 in a 0700
//! directory), written atomically and synced — a write per accepted call,
//! never per tick. Bounded by [`MAX`]: more waiting calls are answered `429`.
//! A turn cut by the shutdown's abort keeps its file (it runs again); a turn
//! that ran removes it. The window between a turn's end and the removal is
//! the only place a call can run twice.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Accepted calls that may wait on disk at once.
pub const MAX: usize = 32;

/// One kept call.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// The endpoint's name (the index may change with the config).
    webhook: String,
    /// The body, base64.
    body: String,
    /// Whether the body was sent as JSON (its fields fill the template).
    json: bool,
}

/// A call read back at start: its file, endpoint name, body and JSON flag.
pub struct Kept {
    pub path: PathBuf,
    pub webhook: String,
    pub body: Vec<u8>,
    pub json: bool,
}

/// Why a call could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("{MAX} accepted webhook calls are already waiting")]
    Full,
    #[error("cannot keep the webhook call in {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// The spool directory.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
}

impl Spool {
    pub fn new(state_dir: &Path) -> Spool {
        Spool { dir: state_dir.join("webhook-spool") }
    }

    /// Keep a call durably (blocking: fsyncs); its file.
    pub fn keep(&self, webhook: &str, body: &[u8], json: bool) -> Result<PathBuf, SpoolError> {
        if self.files().len() >= MAX {
            return Err(SpoolError::Full);
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(body);
        let saved = Saved { webhook: webhook.to_string(), body: b64, json };
        let data = serde_json::to_vec(&saved).unwrap_or_default();
        let nanos = jiff::Timestamp::now().as_nanosecond();
        let path = self.dir.join(format!("{nanos:024}-{}.json", crate::util::unique::next()));
        crate::util::fs::write_atomic(&path, &data).map_err(|e| SpoolError::Io(self.dir.clone(), e))?;
        Ok(path)
    }

    /// The call of `path` has run (or was never queued): forget it.
    pub fn done(&self, path: &Path) {
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("webhooks: cannot remove the kept call {}: {e}", path.display());
            }
        }
    }

    /// Calls an earlier run accepted and did not finish, oldest first. A file
    /// that cannot be read back is renamed `*.bad` and logged, never retried.
    pub fn kept(&self) -> Vec<Kept> {
        let mut out = Vec::new();
        for path in self.files() {
            let read = std::fs::read(&path).ok().and_then(|d| serde_json::from_slice::<Saved>(&d).ok());
            let body = read.as_ref().and_then(|s| base64::engine::general_purpose::STANDARD.decode(&s.body).ok());
            match (read, body) {
                (Some(s), Some(body)) => out.push(Kept { path, webhook: s.webhook, body, json: s.json }),
                _ => {
                    tracing::error!("webhooks: a kept call cannot be read back ({}): set aside", path.display());
                    let _ = std::fs::rename(&path, path.with_extension("bad"));
                }
            }
        }
        out
    }

    /// The kept calls' files, in the order they were accepted.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|dir| dir.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect())
            .unwrap_or_default();
        files.sort();
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_kept_in_order_until_done_and_a_broken_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path());
        assert!(spool.kept().is_empty(), "no directory yet");
        let a = spool.keep("door", b"{\"state\":\"open\"}", true).unwrap();
        let b = spool.keep("bell", b"\x00\xffbinary", false).unwrap();
        let kept = spool.kept();
        assert_eq!(kept.iter().map(|k| k.webhook.as_str()).collect::<Vec<_>>(), ["door", "bell"]);
        assert_eq!((kept[1].body.as_slice(), kept[1].json), (&b"\x00\xffbinary"[..], false));
        spool.done(&a);
        spool.done(&a); // twice: nothing to say
        assert_eq!(spool.kept().len(), 1);
        std::fs::write(&b, "not json").unwrap();
        assert!(spool.kept().is_empty(), "the broken file is not handed out");
        assert!(b.with_extension("bad").exists(), "it is set aside, not deleted");
        for _ in 0..MAX {
            spool.keep("door", b"x", false).unwrap();
        }
        assert!(matches!(spool.keep("door", b"x", false), Err(SpoolError::Full)));
    }
}
