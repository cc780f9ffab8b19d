//! Where the gateway connection stands, kept in
//! `<state>/discord-connection.json` (replaced atomically, 0600) by the
//! daemon's gateway loop at each change (never per heartbeat), and read by
//! `bramble status`, another process: a file is how the state crosses, as
//! Feishu's and Matrix's do. The writer's pid is in it, so a file left by a
//! daemon that is gone is not shown as a live connection.

use std::path::Path;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The file name in the state directory.
pub const CONNECTION_FILE: &str = "discord-connection.json";
/// An error kept at most this long (a gateway's reason can be long).
const MAX_ERROR: usize = 300;

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The first connection is being made.
    Connecting,
    /// READY or RESUMED came: messages are read.
    Connected,
    /// Dropped with a session kept: reconnecting to resume it (nothing missed is lost).
    Resuming,
    /// Dropped without a session (or the gateway cannot be reached): a new session will start.
    Reconnecting,
    /// Off until bramble restarts: a fatal close (a refused token or intents), or the daemon stopped.
    Stopped,
}

/// `discord-connection.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub phase: Phase,
    pub since: Timestamp,
    /// The daemon that wrote it.
    pub pid: u32,
    /// Why it dropped, or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The gateway's close code of a fatal close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_code: Option<u16>,
}

impl Connection {
    /// This process's connection in `phase` now; `why` is cut to a sane length.
    pub fn now(phase: Phase, why: Option<&str>, close_code: Option<u16>) -> Connection {
        let last_error = why.map(|w| crate::util::text::escape_line(w).chars().take(MAX_ERROR).collect());
        Connection { phase, since: Timestamp::now(), pid: std::process::id(), last_error, close_code }
    }

    /// The kept state (none, or unreadable: `None`).
    pub fn load(state_dir: &Path) -> Option<Connection> {
        let text = std::fs::read_to_string(state_dir.join(CONNECTION_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(CONNECTION_FILE), &data)
    }

    /// In words for `bramble status`; `live`: the daemon that wrote it still runs.
    pub fn words(&self, live: bool) -> String {
        let since = self.since.strftime("%Y-%m-%d %H:%M:%S UTC");
        let error = self.last_error.as_deref().unwrap_or("no reason given");
        let said = match self.phase {
            Phase::Connecting => format!("connecting since {since}"),
            Phase::Connected => format!("connected since {since}"),
            Phase::Resuming => format!("resuming since {since} (last error: {error})"),
            Phase::Reconnecting => format!("reconnecting since {since} (last error: {error})"),
            Phase::Stopped => match self.close_code {
                Some(code) => format!("STOPPED since {since}: {error} (close code {code}); restart bramble once fixed"),
                None => format!("stopped since {since}: {error}"),
            },
        };
        match (live, self.phase) {
            (true, _) | (false, Phase::Stopped) => said,
            (false, _) => format!("not running (the last daemon said: {said})"),
        }
    }
}

/// Record `conn` (on a blocking thread); a failure is logged, never fatal.
pub async fn record(state_dir: &Path, conn: Connection) {
    let dir = state_dir.to_path_buf();
    if let Err(e) = crate::util::tasks::blocking(move || conn.save(&dir)).await {
        tracing::warn!(error = %e, "cannot record the Discord connection state for `bramble status`");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_reads_in_words_and_a_gone_daemons_state_is_not_live() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Connection::load(dir.path()).is_none());
        let up = Connection::now(Phase::Connected, None, None);
        up.save(dir.path()).unwrap();
        let read = Connection::load(dir.path()).unwrap();
        assert_eq!(read, up);
        assert!(read.words(true).starts_with("connected since "), "{}", read.words(true));
        assert!(read.words(false).starts_with("not running (the last daemon said: connected since"));
        let resuming = Connection::now(Phase::Resuming, Some("cannot connect to x:1: refused"), None);
        assert!(resuming.words(true).ends_with("(last error: cannot connect to x:1: refused)"));
        let again = Connection::now(Phase::Reconnecting, Some("4009\nsession timed out"), None);
        assert!(again.words(true).contains("reconnecting since") && !again.words(true).contains('\n'));
        let fatal = Connection::now(Phase::Stopped, Some(&"intents ".repeat(100)), Some(4014));
        let words = fatal.words(false);
        assert!(words.starts_with("STOPPED since") && words.contains("(close code 4014)"), "{words}");
        assert!(fatal.last_error.as_ref().unwrap().chars().count() <= MAX_ERROR);
        std::fs::write(dir.path().join(CONNECTION_FILE), "garbage").unwrap();
        assert!(Connection::load(dir.path()).is_none());
    }
}
