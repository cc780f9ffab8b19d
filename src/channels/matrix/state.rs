//! What the Matrix channel keeps in the state directory, each file replaced
//! atomically (0600):
//!
//! - `matrix-sync.json`: the `/sync` position (`since`) and the ids of the
//!   events already handled after it. A batch is handled event by event;
//!   stopping half way saves the old `since` with the handled ids, so after a
//!   restart the batch comes again and only the rest of it is handled.
//! - `matrix-session.json`: the access token a password login gave (once).
//! - `matrix-reports.json`: our recent job reports (event id → job), so a
//!   reaction or a reply to one is Done / Snooze, across restarts.
//! - `matrix-rooms.json`: the rooms joined and why ([`crate::policy::matrix`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Secret;

/// `matrix-sync.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SyncState {
    /// Whose sync it is: a position belongs to one account.
    pub user_id: String,
    pub since: Option<String>,
    /// Events handled from the batch after `since` (empty once `since` moves on).
    pub handled: Vec<String>,
}

/// The sync file of one account.
#[derive(Clone)]
pub struct SyncFile {
    path: PathBuf,
    user_id: String,
}

impl SyncFile {
    pub fn new(state_dir: &Path, user_id: &str) -> SyncFile {
        SyncFile { path: state_dir.join("matrix-sync.json"), user_id: user_id.to_string() }
    }

    /// The saved position, or a fresh start (another account's, or unreadable: logged).
    pub fn load(&self) -> SyncState {
        let fresh = SyncState { user_id: self.user_id.clone(), ..Default::default() };
        let Ok(text) = std::fs::read_to_string(&self.path) else { return fresh };
        match serde_json::from_str::<SyncState>(&text) {
            Ok(s) if s.user_id == self.user_id => s,
            Ok(_) => {
                tracing::info!("the Matrix sync position belongs to another account; starting afresh");
                fresh
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "unreadable Matrix sync position; starting afresh");
                fresh
            }
        }
    }

    pub fn save(&self, state: &SyncState) -> std::io::Result<()> {
        let data = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &data)
    }
}

/// `matrix-session.json`: a password login's token, for this homeserver and account.
#[derive(Clone, Serialize, Deserialize)]
pub struct Session {
    pub homeserver: String,
    pub user_id: String,
    pub access_token: String,
    #[serde(default)]
    pub device_id: String,
}

pub const SESSION_FILE: &str = "matrix-session.json";

impl Session {
    /// The kept token for `homeserver` and `user_id`, if any.
    pub fn load(state_dir: &Path, homeserver: &str, user_id: &str) -> Option<Secret> {
        let text = std::fs::read_to_string(state_dir.join(SESSION_FILE)).ok()?;
        let s: Session = serde_json::from_str(&text).ok()?;
        (s.homeserver == homeserver && s.user_id == user_id).then(|| Secret::new(s.access_token))
    }

    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(SESSION_FILE), &data)
    }

    /// Forget a token the homeserver refused (the next start logs in again).
    pub fn forget(state_dir: &Path) {
        let _ = std::fs::remove_file(state_dir.join(SESSION_FILE));
    }
}

/// Reports remembered for Done / Snooze.
const MAX_REPORTS: usize = 200;
/// The report text kept for a snooze, in characters.
const MAX_REPORT_TEXT: usize = 2000;

/// One job report we posted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportEntry {
    pub event_id: String,
    pub room: String,
    pub job: String,
    pub text: String,
}

/// `matrix-reports.json`: the last [`MAX_REPORTS`] job reports.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportLog {
    pub reports: VecDeque<ReportEntry>,
}

pub const REPORTS_FILE: &str = "matrix-reports.json";

impl ReportLog {
    pub fn load(state_dir: &Path) -> ReportLog {
        std::fs::read_to_string(state_dir.join(REPORTS_FILE))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    /// Remember a report and save the log.
    pub fn add(&mut self, state_dir: &Path, mut entry: ReportEntry) -> std::io::Result<()> {
        if entry.text.chars().count() > MAX_REPORT_TEXT {
            entry.text = entry.text.chars().take(MAX_REPORT_TEXT).collect();
        }
        self.reports.push_back(entry);
        while self.reports.len() > MAX_REPORTS {
            self.reports.pop_front();
        }
        let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(REPORTS_FILE), &data)
    }

    /// The report event `event_id` in `room`, if it is one of ours.
    pub fn find(&self, room: &str, event_id: &str) -> Option<&ReportEntry> {
        self.reports.iter().find(|r| r.event_id == event_id && r.room == room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sync_position_is_per_account_and_survives() {
        let dir = tempfile::tempdir().unwrap();
        let f = SyncFile::new(dir.path(), "@bot:x");
        assert_eq!(f.load().since, None);
        let s = SyncState { user_id: "@bot:x".into(), since: Some("s1".into()), handled: vec!["$a".into()] };
        f.save(&s).unwrap();
        assert_eq!(SyncFile::new(dir.path(), "@bot:x").load(), s);
        assert_eq!(SyncFile::new(dir.path(), "@other:x").load().since, None);
        std::fs::write(dir.path().join("matrix-sync.json"), "garbage").unwrap();
        assert_eq!(f.load().since, None);
    }

    #[test]
    fn reports_are_bounded_and_found_by_room_and_event() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ReportLog::default();
        for i in 0..MAX_REPORTS + 5 {
            let e = ReportEntry { event_id: format!("${i}"), room: "!r:x".into(), job: "j".into(), text: "t".into() };
            log.add(dir.path(), e).unwrap();
        }
        let log = ReportLog::load(dir.path());
        assert_eq!(log.reports.len(), MAX_REPORTS);
        assert!(log.find("!r:x", "$0").is_none() && log.find("!r:x", "$204").is_some());
        assert!(log.find("!other:x", "$204").is_none(), "a reaction in another room is not to our report");
    }
}
