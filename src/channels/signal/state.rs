//! What the Signal channel keeps in the state directory, each file replaced
//! atomically (0600):
//!
//! - `signal-seen.json`: the event stream's last id (a reconnect asks for
//!   what came after it) and the last messages handled, by sender and
//!   timestamp: Signal's own identity of a message. An event stream that
//!   replays (a reconnect, signal-cli's buffer after its restart) hands
//!   nothing over twice, across bramble's restarts too.
//! - `signal-reports.json`: our recent job reports (chat + sent timestamp →
//!   job), so a reaction or a quoted reply to one is Done / Snooze.
//! - `signal-link.json`: whether the daemon's stream is open, since when,
//!   and the last error: written on a change only, read by `bramble status`.
//! - `signal-pins.json`: numbers pinned to uuids ([`crate::policy::signal`]).

use std::collections::VecDeque;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Messages remembered as handled.
const MAX_SEEN: usize = 1000;
/// Reports remembered for Done / Snooze.
const MAX_REPORTS: usize = 200;
/// The report text kept for a snooze, in characters.
const MAX_REPORT_TEXT: usize = 2000;

pub const SEEN_FILE: &str = "signal-seen.json";
pub const REPORTS_FILE: &str = "signal-reports.json";

/// `signal-seen.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Seen {
    pub last_event_id: Option<String>,
    /// `<sender>:<timestamp>`, oldest first.
    pub handled: VecDeque<String>,
}

impl Seen {
    /// The saved state; a missing or unreadable file is a fresh start (logged when unreadable).
    pub fn load(state_dir: &Path) -> Seen {
        let path = state_dir.join(SEEN_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Seen::default() };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "unreadable Signal position; starting afresh");
            Seen::default()
        })
    }

    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(SEEN_FILE), &data)
    }

    /// The key of a message: who sent it and its timestamp.
    pub fn key(sender: &str, timestamp: i64) -> String {
        format!("{sender}:{timestamp}")
    }

    pub fn contains(&self, key: &str) -> bool {
        self.handled.iter().any(|k| k == key)
    }

    pub fn add(&mut self, key: String) {
        self.handled.push_back(key);
        while self.handled.len() > MAX_SEEN {
            self.handled.pop_front();
        }
    }
}

pub const LINK_FILE: &str = "signal-link.json";

/// `signal-link.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Link {
    pub connected: bool,
    /// When it changed (RFC 3339).
    pub since: String,
    pub error: Option<String>,
}

impl Link {
    pub fn load(state_dir: &Path) -> Option<Link> {
        serde_json::from_str(&std::fs::read_to_string(state_dir.join(LINK_FILE)).ok()?).ok()
    }

    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(LINK_FILE), &data)
    }
}

/// One job report we sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportEntry {
    pub chat: String,
    /// The timestamp signal-cli gave the sent message: reactions and quotes name it.
    pub timestamp: i64,
    pub job: String,
    pub text: String,
}

/// `signal-reports.json`: the last [`MAX_REPORTS`] job reports.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportLog {
    pub reports: VecDeque<ReportEntry>,
}

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

    /// The report sent at `timestamp` to one of `chats` (a person's number
    /// and uuid name the same chat), if it is one of ours.
    pub fn find(&self, chats: &[&str], timestamp: i64) -> Option<&ReportEntry> {
        self.reports.iter().find(|r| r.timestamp == timestamp && chats.iter().any(|c| r.chat.eq_ignore_ascii_case(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_messages_survive_and_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Seen::default();
        for i in 0..MAX_SEEN + 3 {
            s.add(Seen::key("u", i as i64));
        }
        s.last_event_id = Some("42".into());
        s.save(dir.path()).unwrap();
        let s = Seen::load(dir.path());
        assert!(!s.contains("u:0") && s.contains(&Seen::key("u", MAX_SEEN as i64 + 2)));
        assert_eq!(s.last_event_id.as_deref(), Some("42"));
        std::fs::write(dir.path().join(SEEN_FILE), "garbage").unwrap();
        assert_eq!(Seen::load(dir.path()), Seen::default());
    }

    #[test]
    fn reports_are_found_by_chat_and_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ReportLog::default();
        let e = ReportEntry { chat: "+491".into(), timestamp: 7, job: "j".into(), text: "t".into() };
        log.add(dir.path(), e).unwrap();
        let log = ReportLog::load(dir.path());
        assert!(log.find(&["uuid", "+491"], 7).is_some());
        assert!(log.find(&["+492"], 7).is_none(), "a reaction in another chat is not to our report");
        assert!(log.find(&["+491"], 8).is_none());
    }
}
