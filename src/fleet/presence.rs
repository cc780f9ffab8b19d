//! Who is in the fleet: each board's retained `fleet/board` document (role,
//! version, capabilities, its jobs) next to the `status` its last will sets
//! to `offline`, and what the others' say, kept as they arrive.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::fleet::{BoardName, FleetRole};

/// One job in a board's presence (`cron list --fleet`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLine {
    pub name: String,
    pub schedule: String,
    pub enabled: bool,
    /// RFC 3339, UTC.
    #[serde(default)]
    pub next_run: Option<String>,
}

/// `bramble/<board>/fleet/board` (retained).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    pub board: BoardName,
    pub role: FleetRole,
    pub version: String,
    /// What the board can do: `exec`, `telegram`, `ha`, … (its tools and channels).
    pub capabilities: Vec<String>,
    /// When this document was published (at start and when the jobs change), RFC 3339.
    pub since: String,
    #[serde(default)]
    pub jobs: Vec<JobLine>,
    /// It polls the chat now (the primary, or a standby that took over).
    #[serde(default)]
    pub chat: bool,
}

/// A board as another sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub online: bool,
    /// When its status last changed or it last said something (unix seconds).
    pub last_seen: Option<i64>,
    pub presence: Option<Presence>,
}

/// Every board heard of, by name.
#[derive(Debug, Clone, Default)]
pub struct Boards(pub BTreeMap<BoardName, Seen>);

impl Boards {
    /// `bramble/<board>/status`: `online` / `offline` (anything else: ignored).
    pub fn status(&mut self, board: &BoardName, payload: &[u8], now: i64) {
        let online = match payload {
            b"online" => true,
            b"offline" => false,
            _ => return,
        };
        let seen = self.0.entry(board.clone()).or_default();
        seen.online = online;
        seen.last_seen = Some(now);
    }

    /// `bramble/<board>/fleet/board`: kept only when it names the board it was published under.
    pub fn presence(&mut self, board: &BoardName, payload: &[u8]) -> Result<(), String> {
        if payload.is_empty() {
            self.0.remove(board);
            return Ok(());
        }
        let p: Presence = serde_json::from_slice(payload).map_err(|e| format!("not a presence document: {e}"))?;
        if &p.board != board {
            return Err(format!("the document says `{}` but was published under `{board}`", p.board));
        }
        self.0.entry(board.clone()).or_default().presence = Some(p);
        Ok(())
    }

    pub fn heard_from(&mut self, board: &BoardName, now: i64) {
        if let Some(s) = self.0.get_mut(board) {
            s.last_seen = Some(now);
        }
    }

    /// The online board that says it polls the chat (`fleet status`, `doctor`).
    pub fn chat_holder(&self) -> Option<&BoardName> {
        self.0.iter().find(|(_, s)| s.online && s.presence.as_ref().is_some_and(|p| p.chat)).map(|(b, _)| b)
    }

    pub fn is_online(&self, board: &BoardName) -> bool {
        self.0.get(board).is_some_and(|s| s.online)
    }

    /// `/boards` and `bramble fleet status`: one line per board.
    pub fn render(&self, me: &BoardName, now: i64) -> String {
        if self.0.is_empty() {
            return "No boards seen yet on the broker.".into();
        }
        let mut out = String::new();
        for (name, s) in &self.0 {
            let state = if s.online { "online" } else { "offline" };
            let (role, version) =
                s.presence.as_ref().map_or(("?", "?".to_string()), |p| (p.role.as_str(), p.version.clone()));
            let ago = s.last_seen.map_or("never".to_string(), |t| ago(now - t));
            let you = if name == me { " (this board)" } else { "" };
            let jobs = s.presence.as_ref().map_or(0, |p| p.jobs.len());
            let chat = if s.online && s.presence.as_ref().is_some_and(|p| p.chat) { ", holds the chat" } else { "" };
            out.push_str(&format!(
                "{name}{you}: {state}, {role}, version {version}, last seen {ago}, {jobs} job(s){chat}\n"
            ));
        }
        out
    }
}

fn ago(secs: i64) -> String {
    match secs.max(0) {
        s if s < 90 => format!("{s} s ago"),
        s if s < 5400 => format!("{} min ago", s / 60),
        s if s < 2 * 86400 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: &str) -> BoardName {
        n.parse().unwrap()
    }

    #[test]
    fn status_and_presence_make_the_board_list() {
        let mut boards = Boards::default();
        let p = Presence {
            board: b("garage"),
            role: FleetRole::Node,
            version: "0.1.0".into(),
            capabilities: vec!["exec".into()],
            since: "2026-01-01T00:00:00Z".into(),
            jobs: vec![],
            chat: false,
        };
        boards.presence(&b("garage"), &serde_json::to_vec(&p).unwrap()).unwrap();
        boards.status(&b("garage"), b"online", 100);
        assert!(boards.is_online(&b("garage")));
        let text = boards.render(&b("living"), 130);
        assert!(text.contains("garage: online, node, version 0.1.0, last seen 30 s ago"), "{text}");
        boards.status(&b("garage"), b"offline", 200);
        assert!(boards.render(&b("living"), 200).contains("garage: offline"));
        // A board cannot speak for another one.
        let err = boards.presence(&b("attic"), &serde_json::to_vec(&p).unwrap()).unwrap_err();
        assert!(err.contains("published under `attic`"), "{err}");
        assert!(boards.presence(&b("attic"), b"{").is_err());
        boards.status(&b("attic"), b"maybe", 1);
        assert!(!boards.0.contains_key(&b("attic")));
    }
}
