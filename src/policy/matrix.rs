//! Matrix: who is served, and which rooms a turn may post to.
//!
//! A Matrix user id (`@owner:example.org`) is an identity (the homeserver
//! vouches for it; nobody else can send as it), so `[matrix] allow_from` is a
//! plain list, no pins. A room is allowed as a target when it is one of
//! `[matrix] rooms`, or a room the bot joined on an allowed user's invite:
//! the channel records those in `<state>/matrix-rooms.json` (this module owns
//! the file's format; the channel writes it, the tools only read it). A model
//! turn therefore cannot post to an arbitrary room, nor to one a stranger
//! pulled the bot into. Users paired with `bramble pair --channel matrix`
//! (`matrix-paired.json`, [`super::pairing`]) are served like `allow_from`'s
//! until revoked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::pairing::{PairChannel, PairedCache};

/// The file name in the state directory.
pub const ROOMS_FILE: &str = "matrix-rooms.json";

/// What the channel knows about one joined room.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoomRecord {
    /// The allowed user whose invite the bot took (`None`: a configured room).
    pub invited_by: Option<String>,
    /// The room has `m.room.encryption`: the bot cannot read it.
    pub encrypted: bool,
    /// The "I cannot read encrypted rooms" notice was posted (once).
    pub warned: bool,
    /// The alias it was joined by, for a configured `#room:server`.
    pub alias: Option<String>,
}

/// `<state>/matrix-rooms.json`: room id → record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rooms {
    pub rooms: BTreeMap<String, RoomRecord>,
}

impl Rooms {
    /// Read it; a missing or unreadable file is no rooms (logged when unreadable).
    pub fn load(state_dir: &Path) -> Rooms {
        let path = state_dir.join(ROOMS_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Rooms::default() };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "unreadable list of Matrix rooms; starting afresh");
            Rooms::default()
        })
    }

    /// Write it (atomic replace, 0600).
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(ROOMS_FILE), &data)
    }

    /// The encrypted rooms (for `status` and `doctor`).
    pub fn encrypted(&self) -> Vec<&str> {
        self.rooms.iter().filter(|(_, r)| r.encrypted).map(|(id, _)| id.as_str()).collect()
    }
}

/// `[matrix] allow_from` and `rooms`, the paired users, and the rooms joined on invites.
#[derive(Debug, Clone)]
pub struct MatrixPolicy {
    users: Vec<String>,
    rooms: Vec<String>,
    state_dir: PathBuf,
    paired: PairedCache,
}

impl Default for MatrixPolicy {
    fn default() -> MatrixPolicy {
        MatrixPolicy::new(&[], &[], Path::new(""))
    }
}

impl MatrixPolicy {
    pub fn new(allow_from: &[String], rooms: &[String], state_dir: &Path) -> MatrixPolicy {
        MatrixPolicy {
            users: allow_from.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect(),
            rooms: rooms.iter().map(|r| r.trim().to_string()).collect(),
            state_dir: state_dir.to_path_buf(),
            paired: PairedCache::new(state_dir, PairChannel::Matrix),
        }
    }

    /// Whether `user` (`@local:server`) is served: in `allow_from` or paired
    /// (as of the last [`MatrixPolicy::refresh`]). Exact, as ids are.
    pub fn allows(&self, user: &str) -> bool {
        self.users.iter().any(|u| u == user) || self.paired.contains(user)
    }

    /// Whether `user` is served now (the paired list read again if it
    /// changed). Blocking: call it off the runtime thread.
    pub fn allows_now(&self, user: &str) -> bool {
        self.refresh();
        self.allows(user)
    }

    /// Read the paired users again if `bramble pair` changed them. Blocking (one `stat`).
    pub fn refresh(&self) {
        if !self.state_dir.as_os_str().is_empty() {
            self.paired.refresh();
        }
    }

    /// Serve `user`, just paired, at once.
    pub fn add_paired(&self, user: &str) {
        self.paired.add(user);
    }

    /// Whether a turn may post to `room`: a configured room (by id or alias),
    /// or one joined on an allowed user's invite. Blocking (reads the rooms
    /// file): call it off the runtime thread.
    pub fn room_allowed(&self, room: &str) -> bool {
        if self.rooms.iter().any(|r| r == room) {
            return true;
        }
        self.refresh();
        let known = Rooms::load(&self.state_dir);
        known.rooms.iter().any(|(id, r)| {
            let by_us = r.invited_by.as_deref().is_some_and(|u| self.allows(u)) || r.alias.is_some();
            by_us && (id == room || r.alias.as_deref() == Some(room))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_allowed_by_config_or_an_allowed_invite() {
        let dir = tempfile::tempdir().unwrap();
        let p = MatrixPolicy::new(&["@owner:x".into()], &["#ops:x".into()], dir.path());
        assert!(p.allows("@owner:x") && !p.allows("@Owner:x") && !p.allows("@mallory:x"));
        assert!(p.room_allowed("#ops:x") && !p.room_allowed("!dm:x"));
        let mut rooms = Rooms::default();
        let rec = |by: &str| RoomRecord { invited_by: Some(by.into()), ..Default::default() };
        rooms.rooms.insert("!dm:x".into(), rec("@owner:x"));
        rooms.rooms.insert("!old:x".into(), rec("@former:x"));
        rooms.save(dir.path()).unwrap();
        assert!(p.room_allowed("!dm:x"));
        assert!(!p.room_allowed("!old:x"), "invited by someone no longer in allow_from");
        std::fs::write(dir.path().join(ROOMS_FILE), "garbage").unwrap();
        assert!(!p.room_allowed("!dm:x") && p.room_allowed("#ops:x"));
        rooms.save(dir.path()).unwrap();
        // A paired user is served, and the room they invited the bot to is allowed, until revoked.
        let now = jiff::Timestamp::now();
        crate::policy::pairing::new_code(dir.path(), PairChannel::Matrix, now).unwrap();
        let code: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("matrix-pair-code.json")).unwrap()).unwrap();
        let former = crate::bus::Principal::Matrix("@former:x".into());
        let code = code["code"].as_str().unwrap();
        crate::policy::pairing::redeem(dir.path(), code, &former, None, now).unwrap();
        assert!(p.allows_now("@former:x") && p.room_allowed("!old:x"));
        crate::policy::pairing::revoke(dir.path(), &former).unwrap();
        assert!(!p.allows_now("@former:x") && !p.room_allowed("!old:x"));
    }
}
