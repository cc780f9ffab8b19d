//! What the Feishu / Lark channel keeps in `<state>/feishu-state.json`
//! (replaced atomically, 0600): the ids of the events and messages already
//! handled (the server delivers an event again when it was not answered in
//! time, also across our restarts), when the long connection last came up,
//! and the last error, for `bramble status`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file name in the state directory.
pub const STATE_FILE: &str = "feishu-state.json";
/// How many handled ids are remembered (the server retries within hours, not thousands of events).
const MAX_SEEN: usize = 1024;

/// `feishu-state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// Handled event ids and message ids, oldest first.
    pub seen: VecDeque<String>,
    /// When the long connection last came up (RFC 3339).
    pub connected: Option<String>,
    /// The last failure to connect or stay connected, with its time.
    pub last_error: Option<String>,
}

impl State {
    pub fn seen(&self, id: &str) -> bool {
        !id.is_empty() && self.seen.iter().any(|s| s == id)
    }

    /// Remember `id` (the oldest is forgotten past [`MAX_SEEN`]).
    pub fn mark(&mut self, id: &str) {
        if id.is_empty() || self.seen(id) {
            return;
        }
        if self.seen.len() >= MAX_SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back(id.to_string());
    }
}

/// The state file of one state directory.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(state_dir: &Path) -> StateFile {
        StateFile { path: state_dir.join(STATE_FILE) }
    }

    /// The saved state, or a fresh one (unreadable: logged).
    pub fn load(&self) -> State {
        let Ok(text) = std::fs::read_to_string(&self.path) else { return State::default() };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %self.path.display(), error = %e, "unreadable Feishu state; starting afresh");
            State::default()
        })
    }

    pub fn save(&self, state: &State) -> std::io::Result<()> {
        let data = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_remembered_across_a_save_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        let mut s = file.load();
        s.mark("ev1");
        s.mark("ev1");
        s.mark("");
        assert_eq!(s.seen.len(), 1);
        file.save(&s).unwrap();
        assert!(file.load().seen("ev1") && !file.load().seen("ev2") && !file.load().seen(""));
        for i in 0..MAX_SEEN + 5 {
            s.mark(&format!("m{i}"));
        }
        assert_eq!(s.seen.len(), MAX_SEEN);
        assert!(!s.seen("ev1") && s.seen(&format!("m{}", MAX_SEEN + 4)));
        std::fs::write(dir.path().join(STATE_FILE), "garbage").unwrap();
        assert_eq!(file.load(), State::default());
    }
}
